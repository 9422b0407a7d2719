package ib

import (
	"sync"

	"github.com/rxed/rxed/pkg/qp"
)

// qpEvents runs a QP's asynchronous event handlers (QP.OnEvent) outside
// the engine, as cqNotifier does for a CQ's notifications: the engine
// raises the event on the worker that owns the QP's shard, where a
// handler that called a waiting verb (Modify, Query, Destroy), or took a
// lock held around one (pkg/rdmacm's CM takes the MAD agent's send lock,
// held across PostSend), would wait for itself. So the engine's side only
// queues the event and, unless one runs, starts a runner goroutine that
// calls the handlers until the queue is empty. Events of a QP are few
// (COMM_EST once per connection, a fatal error, SQ drains): no bound.
type qpEvents struct {
	mu       sync.Mutex
	handlers []*qpEventHandler // in the order installed
	queue    []AsyncEvent
	running  bool // a runner goroutine exists; at most one per QP
}

type qpEventHandler struct{ fn func(AsyncEvent) }

// OnEvent installs fn to be called with each asynchronous event affiliated
// with the QP (EventQPFatal, EventCommEst, EventSQDrained) raised from now
// on, besides its delivery on Device.Events. It returns the function that
// removes fn; no call of fn starts after that returns (one in progress is
// not waited for: fn may remove itself).
//
// fn runs on a goroutine of its own, never in the engine, so it may call
// any verb. Calls for one QP never overlap and follow the order in which
// the events were raised; fn must not block for long, as the QP's later
// events wait for it. Several handlers may be installed (an application
// and pkg/rdmacm, which ends a passive handshake whose RTU was lost on
// EventCommEst, as ib_cm_notify): each sees every event.
func (q *QP) OnEvent(fn func(AsyncEvent)) (remove func()) {
	h := &qpEventHandler{fn: fn}
	e := &q.events
	e.mu.Lock()
	e.handlers = append(e.handlers, h)
	e.mu.Unlock()
	return func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		for i, o := range e.handlers {
			if o == h {
				e.handlers = append(e.handlers[:i:i], e.handlers[i+1:]...)
				return
			}
		}
	}
}

// raiseOn is the qp.Config hook that raises an event of type t on
// Device.Events and for the QP's handlers, on the engine's worker that
// owns the QP. Neither waits: Events' queue and the handlers' take the
// event and return. Device.Events has it first, so it is there before a
// handler runs.
func (q *QP) raiseOn(t EventType) func(*qp.QP) {
	return func(x *qp.QP) {
		ev := AsyncEvent{Type: t, QPN: x.Num()}
		q.pd.d.post(ev, q)
		q.raise(ev)
	}
}

// raise queues ev for the QP's handlers. Called by the engine's worker
// (raiseOn's hooks): it takes only e.mu, a leaf, and never blocks.
func (q *QP) raise(ev AsyncEvent) {
	e := &q.events
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.handlers) == 0 {
		return
	}
	e.queue = append(e.queue, ev)
	if !e.running {
		e.running = true
		go q.runEvents()
	}
}

// runEvents delivers queued events until none is left.
func (q *QP) runEvents() {
	e := &q.events
	for {
		e.mu.Lock()
		if len(e.queue) == 0 || len(e.handlers) == 0 {
			e.queue = nil
			e.running = false
			e.mu.Unlock()
			return
		}
		ev := e.queue[0]
		e.queue = e.queue[1:]
		// Removal copies the slice, so this one stays as it is.
		hs := e.handlers
		e.mu.Unlock()
		for _, h := range hs {
			// Removed meanwhile (by another handler, or its owner):
			// not called.
			if q.installed(h) {
				h.fn(ev)
			}
		}
	}
}

func (q *QP) installed(h *qpEventHandler) bool {
	e := &q.events
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, o := range e.handlers {
		if o == h {
			return true
		}
	}
	return false
}
