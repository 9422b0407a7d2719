package roce

import "time"

// kick asks the worker to run qpn's requester, coalescing repeated kicks.
func (w *worker) kick(qpn uint32) {
	w.kickMu.Lock()
	pending := w.kicked.has(qpn)
	if !pending {
		w.kicked.add(qpn)
	}
	owned := w.kstate.Or(kKicked)&kOwned != 0
	w.kickMu.Unlock()
	if pending || owned {
		return
	}
	w.enqueue(event{kind: evKick, qpn: qpn})
}

// tryInline runs f as the shard's owner in the calling goroutine if the
// worker is idle (and, with needIdle, nothing is queued for it), then
// flushes and rearms like the worker loop would. It reports whether f ran.
func (w *worker) tryInline(needIdle bool, f func()) bool {
	if !w.tryAcquire(needIdle) {
		return false
	}
	f()
	w.releaseInline()
	return true
}

// tryAcquire makes the calling goroutine the shard's owner if the worker
// is idle (and, with needIdle, nothing is queued for it).
func (w *worker) tryAcquire(needIdle bool) bool {
	if needIdle && w.pending.Load() != 0 {
		return false
	}
	if !w.own.TryLock() {
		return false
	}
	if needIdle && w.pending.Load() != 0 {
		w.own.Unlock()
		return false
	}
	w.inline = true
	w.setOwned()
	return true
}

// releaseInline ends an inline ownership taken by tryAcquire: answer
// window, kicked QPs, flush, rearm; QPs that still want to send are left
// to the worker goroutine.
func (w *worker) releaseInline() { w.release(false, false) }

// release is releaseInline, for a poller when polled: a poller gets no
// answer window (it answers after Poll returns), and with keep (a short
// receive batch: Engine.dispatch) a batch holding ACKs for messages it
// received is left unsent for that answer to join. The next owner of the
// shard sends it (the application's post, a poll that receives more: a
// batch is kept once), or the poller's next empty poll does
// (Engine.sendKept), or the worker's timer, armed for keepSpan, makes the
// worker goroutine do it if nobody else has. A batch of posts kept for
// others to join (doorbell.go) stays kept the same way until it is full
// or late.
//
// Why not wake the worker at once (an evWake, before): the application
// answers within microseconds, so the woken worker found nothing to do,
// yet it was scheduled every round trip, on the spinner's own CPU (the
// goroutine it readied runs at the spinner's next yield).
// BenchmarkSendLatency8, medians of 3 runs alternating: poll 8.6 -> 8.2
// us, hybrid 8.7 -> 8.0 (docs/performance.md, session S).
func (w *worker) release(polled, keep bool) {
	w.runAfterRx()
	keepBatch := keep && w.txN > 0 && w.received() && w.keptUntil.IsZero()
	if !polled {
		w.answerWindow()
	}
	w.settle()
	w.inline = false
	switch {
	case w.holdsPosts():
		keepBatch = true // posts wait for others (doorbell.go)
	case keepBatch:
		w.keep()
	default:
		w.unkeep() // the flush below sends it
	}
	// Rearm before the flush: its clock reading is then the one this
	// stretch of work already made (clockNow; a flush ends the stretch).
	// The timer fires late by the stretch's microseconds at most.
	w.rearm()
	if !keepBatch {
		w.flush()
	}
	wake := len(w.ready) > 0
	w.own.Unlock()
	if wake {
		// A full inbox already guarantees the worker another round.
		w.offer(event{kind: evWake})
	}
}

// keep marks the batch kept for the application's answer (release): the
// timer is armed for keptUntil, and the engine's next empty poll sends it
// (Engine.sendKept).
func (w *worker) keep() { w.keepFor(keepSpan) }

// keepFor keeps the batch unsent for up to span: the worker's timer is
// armed for keptUntil (rearm), and an empty poll finds it (keptBatches).
func (w *worker) keepFor(span time.Duration) {
	w.keptUntil = w.clockNow().Add(span)
	w.e.keptBatches.Add(1)
}

// unkeep ends keep, the batch being sent (flush) or let go unkept.
func (w *worker) unkeep() {
	w.keptPosts = false
	if !w.keptUntil.IsZero() {
		w.keptUntil = time.Time{}
		w.e.keptBatches.Add(-1)
	}
}

// keepSpan bounds how long a kept batch waits for the application's
// answer: well above the microseconds an application takes to answer
// what it just received, and far below the milliseconds of a peer's
// retransmit timer, so the ACK it holds is never the reason a peer
// retransmits.
const keepSpan = 50 * time.Microsecond

// lockOwned makes the worker goroutine the shard's owner.
func (w *worker) lockOwned() {
	w.own.Lock()
	w.setOwned()
}

// received reports whether the current owner completed a receive (a
// SEND message) on the shard.
func (w *worker) received() bool { return w.ctr.RDMARecvs.Load() != w.recvsOwned }

// setOwned records (under own) that kicks are now the owner's to run, and
// the receive count received compares against.
func (w *worker) setOwned() {
	w.recvsOwned = w.ctr.RDMARecvs.Load()
	w.nowSet = false
	w.kstate.Or(kOwned)
}

// unmarkKickedIfEmpty clears kKicked once kicked is empty. Called under
// kickMu, by whoever takes QPs out of kicked (settle, an evKick).
func (w *worker) unmarkKickedIfEmpty() {
	if w.kicked.empty() {
		w.kstate.And(^kKicked)
	}
}

// The bits of worker.kstate.
const (
	kOwned  uint32 = 1 << iota // the shard's owner runs kicked QPs before it lets go
	kKicked                    // kicked may hold QPs
)

// settle runs every kicked QP until none is left, then stops taking
// kicks (later ones queue an event). Called under own, before flushing,
// so an answer posted during this round leaves with the round's batch.
//
// A kick is never lost: kick inserts, then sets kKicked and reads kOwned
// in one atomic step; settle clears kOwned only by a compare-and-swap
// that fails while kKicked is set. So a kick either comes before that
// swap (which fails, and settle takes the QP from kicked) or after it
// (the kick sees no owner and queues an event).
func (w *worker) settle() {
	for {
		if w.kstate.CompareAndSwap(kOwned, 0) {
			return
		}
		var nums [16]uint32
		w.kickMu.Lock()
		n := w.kicked.take(nums[:])
		w.unmarkKickedIfEmpty()
		w.kickMu.Unlock()
		for _, qpn := range nums[:n] {
			w.runQP(w.qps[qpn])
		}
	}
}

// closeFlush sends the shard's batch for Engine.Close, as the shard's
// last owner: it waits for the current one (the worker goroutine, or an
// inline owner) to let go.
func (w *worker) closeFlush() {
	if w.testCloseWaits != nil {
		w.testCloseWaits()
	}
	w.own.Lock()
	w.flush()
	w.own.Unlock()
}
