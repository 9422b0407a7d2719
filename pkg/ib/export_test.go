package ib

// Push queues wc on cq as the engine would, for the external tests that
// drive a CQ without traffic. It is not part of the API: only the
// engine completes work.
func Push(cq *CQ, wc WC) error { return cq.c.Push(wc) }

// SpinYielded and SetSpinYielded read and set when cq's spinner last
// yielded (cq_spin.go), in ns since spinEpoch.
func SpinYielded(cq *CQ) int64        { return cq.spin.yielded.Load() }
func SetSpinYielded(cq *CQ, at int64) { cq.spin.yielded.Store(at) }

// PushAsEngine queues wc on cq through the engine's sink, which raises
// EventCQErr when the CQ is full, as rxe_cq_post does.
func PushAsEngine(cq *CQ, wc WC) error { return cqSink{cq}.Push(wc) }

// RaiseQPEvent raises an event of type t for q as the engine's worker
// does, through the QP's qp.Config hook.
func RaiseQPEvent(q *QP, t EventType) { q.raiseOn(t)(q.q) }

// TakeSRQ consumes s's oldest receive as a QP on it would (firing the
// armed limit event), and reports whether there was one.
func TakeSRQ(s *SRQ) bool { return s.srq.Pop(nil) }

// QueuedEvents returns the events Events has not yielded yet, in order
// (the one being offered first), without taking them. Right after a read
// the event read may still be listed: the device's goroutine notes the
// hand-over after it.
func QueuedEvents(d *Device) []AsyncEvent {
	q := d.async
	q.mu.Lock()
	defer q.mu.Unlock()
	var evs []AsyncEvent
	if q.offering {
		evs = append(evs, q.offer.ev)
	}
	for _, e := range q.pending {
		evs = append(evs, e.ev)
	}
	return evs
}

// WaitOffering waits until Events offers ev: the device's goroutine has
// taken it off the queue and waits for a reader.
func WaitOffering(d *Device, ev AsyncEvent) {
	q := d.async
	q.mu.Lock()
	defer q.mu.Unlock()
	for !q.offering || q.offer.ev != ev {
		q.turn.Wait()
	}
}
