package roce

import "time"

// A worker's timers: one engine timer per shard, pointed at the earliest
// QP deadline (qp.QP.Deadline: the retransmit or RNR timer). The QPs with
// a deadline are kept in a binary min-heap keyed by it, so finding the
// earliest costs O(1) and re-keying a QP O(log n), instead of a scan of
// every QP of the shard on each round of the worker loop (4096 QPs: the
// scan was the loop's largest cost).
//
// Keys are kept current by touching: a QP's deadline changes only while
// its owner runs its protocol (qp.QP.Run, Receive, OnTimer, Modify,
// PersistDone), and every such path ends in worker.runQP or onTimer,
// which touch the QP's entry. rearm re-keys the touched entries before it
// reads the heap's minimum. Modify outside those paths (a failed
// ModifyQP) can only clear a deadline (reset, ERR), which leaves a key
// earlier than the truth: the timer then fires early, onTimer finds the
// QP not due (it always re-reads Deadline) and re-keys it, as the scan
// would have found nothing to do. A destroyed QP's entry (DestroyQP only
// deletes it from the shard's map) is dropped when it reaches the top.
//
// Owned by the shard's owner (worker.own), like the rest of the worker.

// timerState is a QP entry's place in its worker's timer heap.
type timerState struct {
	at      time.Time // the key: the QP's deadline when last re-keyed
	pos     int       // 1 + index in timerHeap.ents; 0: not in the heap
	touched bool      // on worker.touched, to be re-keyed
}

// timerHeap is a min-heap of QP entries by deadline; equal deadlines are
// ordered by QP number, so expiries are deterministic.
type timerHeap struct {
	ents []*qpEntry
}

func (h *timerHeap) len() int { return len(h.ents) }

// top returns the entry with the earliest deadline, or nil.
func (h *timerHeap) top() *qpEntry {
	if len(h.ents) == 0 {
		return nil
	}
	return h.ents[0]
}

// set keys ent at d, inserting or moving it; a zero d removes it.
func (h *timerHeap) set(ent *qpEntry, d time.Time) {
	if d.IsZero() {
		h.remove(ent)
		return
	}
	if ent.tm.pos == 0 {
		ent.tm.at = d
		h.ents = append(h.ents, ent)
		ent.tm.pos = len(h.ents)
		h.up(len(h.ents) - 1)
		return
	}
	if d.Equal(ent.tm.at) {
		return
	}
	earlier := d.Before(ent.tm.at)
	ent.tm.at = d
	if i := ent.tm.pos - 1; earlier {
		h.up(i)
	} else {
		h.down(i)
	}
}

// remove takes ent out of the heap (a no-op if it is not in it).
func (h *timerHeap) remove(ent *qpEntry) {
	if ent.tm.pos == 0 {
		return
	}
	i, last := ent.tm.pos-1, len(h.ents)-1
	if i != last {
		h.swap(i, last)
	}
	h.ents[last] = nil
	h.ents = h.ents[:last]
	ent.tm.pos = 0
	if i != last {
		h.down(i)
		h.up(i)
	}
}

func (h *timerHeap) less(i, j int) bool {
	a, b := h.ents[i], h.ents[j]
	if !a.tm.at.Equal(b.tm.at) {
		return a.tm.at.Before(b.tm.at)
	}
	return a.q.Num() < b.q.Num()
}

func (h *timerHeap) swap(i, j int) {
	h.ents[i], h.ents[j] = h.ents[j], h.ents[i]
	h.ents[i].tm.pos = i + 1
	h.ents[j].tm.pos = j + 1
}

func (h *timerHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *timerHeap) down(i int) {
	n := len(h.ents)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		c := l
		if r := l + 1; r < n && h.less(r, l) {
			c = r
		}
		if !h.less(c, i) {
			return
		}
		h.swap(i, c)
		i = c
	}
}

// touch records that ent's deadline may have changed (under own).
func (w *worker) touch(ent *qpEntry) {
	if !ent.tm.touched {
		ent.tm.touched = true
		w.touched = append(w.touched, ent)
	}
}

// rekey brings the heap up to date with the touched entries' deadlines.
func (w *worker) rekey() {
	for i, ent := range w.touched {
		ent.tm.touched = false
		if w.qps[ent.q.Num()] != ent {
			w.timers.remove(ent) // destroyed
		} else {
			w.timers.set(ent, ent.q.Deadline())
		}
		w.touched[i] = nil
	}
	w.touched = w.touched[:0]
}

// nextTimer returns the live entry with the earliest deadline, dropping
// destroyed ones from the top, or nil.
func (w *worker) nextTimer() *qpEntry {
	for {
		ent := w.timers.top()
		if ent == nil || w.qps[ent.q.Num()] == ent {
			return ent
		}
		w.timers.remove(ent)
	}
}

// onTimer fires the timers of the QPs whose deadline has passed, in
// deadline order.
func (w *worker) onTimer() {
	now := w.e.clock.Now()
	w.rekey()
	due := w.due[:0]
	for ent := w.nextTimer(); ent != nil && !now.Before(ent.tm.at); ent = w.nextTimer() {
		w.timers.remove(ent)
		due = append(due, ent)
	}
	for i, ent := range due {
		// The key may be older than a cleared deadline (see above).
		if d := ent.q.Deadline(); !d.IsZero() && !now.Before(d) {
			if ent.q.OnTimer(w, now, runBudget) {
				w.markReady(ent)
			}
		}
		w.touch(ent)
		due[i] = nil
	}
	w.due = due[:0]
}

// rearm points the worker's timer at the earliest QP deadline, or at a
// kept batch's (keptUntil) if that comes first.
func (w *worker) rearm() {
	w.rekey()
	var best time.Time
	ent := w.nextTimer()
	if ent != nil {
		best = ent.tm.at
	}
	if k := w.keptUntil; !k.IsZero() && (best.IsZero() || k.Before(best)) {
		best = k // a kept batch's deadline (release)
	}
	if best.Equal(w.timerAt) {
		return
	}
	w.timerAt = best
	if best.IsZero() {
		w.timer.Stop()
		w.wakeFor(nil, time.Time{})
		return
	}
	now := w.clockNow()
	d := best.Sub(now)
	if d < 0 {
		d = 0
	}
	w.timer.Reset(d)
	w.wakeFor(ent, now)
}

// wakeFor tells the idle waker (idlewake.go) what an idle process must
// wake up for after rearm: ent's deadline when ent (the earliest QP
// timer) is losing packets (qp.QP.LossRecent), even while a kept batch's
// timer comes first, since the loss's resend is what must not wait out
// the runtime's rounding; nothing otherwise. The clean path (no alarm
// before, none now) is one load and no call. A zero now is read here if
// it is needed.
func (w *worker) wakeFor(ent *qpEntry, now time.Time) {
	var deadline time.Time
	if ent != nil && ent.q.LossRecent(now) {
		deadline = ent.tm.at
	}
	if deadline.IsZero() && w.wakeAt.Load() == 0 {
		return
	}
	if now.IsZero() {
		now = w.clockNow()
	}
	w.e.wake.wakeBy(&w.wakeAt, now, deadline)
}
