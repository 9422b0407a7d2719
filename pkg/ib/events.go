package ib

import (
	"github.com/rxed/rxed/pkg/roce"
)

// EventType is enum ibv_event_type (the subset rxed raises).
type EventType int

// Asynchronous event types, with the ibv_event_type values.
const (
	EventCQErr           EventType = 0  // IBV_EVENT_CQ_ERR: a CQ overflowed
	EventQPFatal         EventType = 1  // IBV_EVENT_QP_FATAL: a QP entered ERR by itself
	EventCommEst         EventType = 3  // IBV_EVENT_COMM_EST: a connected QP took its first request since RTR
	EventSQDrained       EventType = 5  // IBV_EVENT_SQ_DRAINED: a QP moved to SQD with AttrEnSQDAsyncNotify has drained
	EventPortActive      EventType = 9  // IBV_EVENT_PORT_ACTIVE
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

// Events returns the asynchronous event channel (ibv_get_async_event). It
// is buffered; events are dropped when nobody reads and it is full.
func (d *Device) Events() <-chan AsyncEvent { return d.events }

func (d *Device) post(ev AsyncEvent) {
	select {
	case d.events <- ev:
	default:
	}
}

// engineEvent is the engine's OnEvent, called on the worker that owns the
// QP: it hands the event over to Events without blocking (the QP's own
// handlers get it through its hooks: QP.raiseOn).
func (d *Device) engineEvent(ev roce.Event) {
	var ae AsyncEvent
	switch ev.Type {
	case roce.EventQPFatal:
		ae = AsyncEvent{Type: EventQPFatal, QPN: ev.QPN}
	case roce.EventCommEst:
		ae = AsyncEvent{Type: EventCommEst, QPN: ev.QPN}
	case roce.EventSQDrained:
		ae = AsyncEvent{Type: EventSQDrained, QPN: ev.QPN}
	default:
		return
	}
	d.post(ae)
}
