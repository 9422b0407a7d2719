package ib

// EventType is enum ibv_event_type (the subset rxed raises).
type EventType int

// Asynchronous event types, with the ibv_event_type values.
//
// They differ from rdma_rxe's (Linux 6.1), whose only events are
// CQ_ERR (rxe_cq_post, on every completion a full CQ loses), SRQ_LIMIT_REACHED
// (get_srq_wqe, once per arm), SQ_DRAINED (rxe_comp.c) and the port's:
//
//   - EventQPFatal is rxed's: rxe_qp_error dispatches nothing, neither
//     QP_FATAL nor QP_REQ_ERR nor QP_ACCESS_ERR, when a remote error, a
//     retry or RNR retry exhaustion or a responder error takes a QP to ERR.
//     rxed raises it once per such move, after the failed WR's completion
//     and every flush completion are in the CQs; never for a move to ERR
//     by Modify.
//   - EventCommEst is rxed's too (rdma_rxe raises none; HCAs do).
//   - EventPortActive comes once, as the device opens; rxe dispatches it
//     when the port comes up, to the contexts open then.
//   - No IBV_EVENT_QP_LAST_WQE_REACHED, as rxe 6.1 raises none for a QP
//     on an SRQ that enters ERR.
const (
	EventCQErr           EventType = 0  // IBV_EVENT_CQ_ERR: a CQ overflowed
	EventQPFatal         EventType = 1  // IBV_EVENT_QP_FATAL: a QP entered ERR by itself (rxed's own: see above)
	EventCommEst         EventType = 3  // IBV_EVENT_COMM_EST: a connected QP took its first request since RTR
	EventSQDrained       EventType = 5  // IBV_EVENT_SQ_DRAINED: a QP moved to SQD with AttrEnSQDAsyncNotify has drained
	EventPortActive      EventType = 9  // IBV_EVENT_PORT_ACTIVE: once, as the device opens
	EventSRQLimitReached EventType = 15 // IBV_EVENT_SRQ_LIMIT_REACHED
)

// String returns the libibverbs name.
func (t EventType) String() string {
	switch t {
	case EventCQErr:
		return "CQ_ERR"
	case EventQPFatal:
		return "QP_FATAL"
	case EventCommEst:
		return "COMM_EST"
	case EventSQDrained:
		return "SQ_DRAINED"
	case EventPortActive:
		return "PORT_ACTIVE"
	case EventSRQLimitReached:
		return "SRQ_LIMIT_REACHED"
	}
	return "EVENT_UNKNOWN"
}

// AsyncEvent is struct ibv_async_event.
type AsyncEvent struct {
	Type EventType // event_type
	QPN  uint32    // EventQPFatal, EventCommEst, EventSQDrained
	CQ   *CQ       // EventCQErr
	SRQ  *SRQ      // EventSRQLimitReached
	Port uint8     // EventPortActive
}

// Events returns the asynchronous event channel (ibv_get_async_event).
// Every event raised is queued until it is read, however long the
// application takes, as the kernel queues them: the queue is bounded only
// by memory (a program that never reads keeps, for each QP, CQ and SRQ
// not destroyed, every event raised on it; a CQ that keeps overflowing
// raises one per completion lost). Events come in the order raised, one
// at a time: the channel is unbuffered, fed by a goroutine of the device
// that Close joins. The same channel is returned on every call; it is
// never closed.
//
// There is no ibv_ack_async_event: no destroy waits for events to be
// acknowledged. Destroying a QP, CQ or SRQ drops its events not read yet,
// as the kernel does (ib_uverbs_release_uevent, ib_uverbs_release_ucq):
// once Destroy has returned, Events yields none of that object's. Close
// drops every event not yet read, as closing the device frees the
// kernel's async event queue; the channel then stays open and yields
// nothing, so a reader selects on Done too.
func (d *Device) Events() <-chan AsyncEvent { return d.async.out }

// post queues ev, raised on src (nil for the port's events), for Events.
// It is called by engine workers and never waits for the reader: it only
// appends under the queue's lock, a leaf (asyncqueue.go).
func (d *Device) post(ev AsyncEvent, src eventSource) { d.async.post(ev, src) }

// eventsGone (eventSource) is set by each Destroy before it drops the
// object's events.
func (q *QP) eventsGone() bool  { return q.eventsOff.Load() }
func (cq *CQ) eventsGone() bool { return cq.users.retired() }
func (s *SRQ) eventsGone() bool { return s.users.retired() }
