package ib

import "sync"

// asyncQueue holds the device's asynchronous events between the goroutine
// that raises one and the application reading Device.Events, as the
// kernel's async event file does (ib_uverbs_async_handler appends each
// event to ev_queue.event_list, a list without bound, until
// ib_uverbs_event_read takes it).
//
// The raising side is an engine worker (or whoever owns a shard inline),
// which must never wait for the application: post only appends under mu,
// a leaf held for an append. The channel Events returns is unbuffered and
// fed by one pump goroutine, so an event leaves the queue only when it is
// read, and a destroy (drop) can still take back every event of its
// object that nobody has read, the one the pump is offering included, as
// ib_uverbs_release_uevent and ib_uverbs_release_ucq free the destroyed
// object's entries of the list. A buffered channel would hand events over
// before they are read, out of a destroy's reach.
//
// Device.Close stops the pump and joins it; the events not read by then
// are dropped with the device, as closing the async event file frees its
// list, and later ones are not queued.
type asyncQueue struct {
	out chan AsyncEvent // Device.Events; unbuffered, sent on by pump alone

	mu       sync.Mutex
	turn     sync.Cond    // broadcast when the pump starts or stops offering an event
	pending  []asyncEntry // raised, not offered yet, in the order raised
	offer    asyncEntry   // the event the pump offers on out, while offering
	offers   uint64       // counts offers, so a drop tells one from the next
	offering bool
	dropped  bool // a drop took back offer: the pump lets it go
	closed   bool

	wake   chan struct{} // one slot: pending grew, or offer was dropped
	stop   chan struct{} // closed by close
	exited chan struct{} // closed when the pump returns
}

// asyncEntry is a queued event and what it is affiliated with.
type asyncEntry struct {
	ev  AsyncEvent
	src eventSource // nil for the port's events
}

// eventSource is an object whose destroy drops its unread events: a *QP,
// *CQ or *SRQ.
type eventSource interface {
	// eventsGone reports whether the object's destroy has begun dropping
	// its events: no event of it is queued from then on. It is set before
	// the destroy's drop, so an event posted meanwhile is either refused
	// here or queued before the drop takes it back.
	eventsGone() bool
}

func newAsyncQueue() *asyncQueue {
	q := &asyncQueue{
		out:    make(chan AsyncEvent),
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		exited: make(chan struct{}),
	}
	q.turn.L = &q.mu
	go q.pump()
	return q
}

// post queues ev, affiliated with src (nil for the port). It never waits
// for the reader: engine workers call it. A nil queue (a Device that
// OpenDevice did not make: pkg/ib's internal tests) takes nothing.
func (q *asyncQueue) post(ev AsyncEvent, src eventSource) {
	if q == nil {
		return
	}
	q.mu.Lock()
	if q.closed || (src != nil && src.eventsGone()) {
		q.mu.Unlock()
		return
	}
	q.pending = append(q.pending, asyncEntry{ev: ev, src: src})
	q.mu.Unlock()
	q.kick()
}

func (q *asyncQueue) kick() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// drop removes src's events nobody has read; src.eventsGone must already
// report true. If the pump is offering one of them, drop waits until the
// pump has let it go (or a reader took it first, which then read it
// before the destroy): once drop returns, Events yields none of src's.
// The pump only ever waits for a reader, the wake drop sends it, or
// close, so the wait is short.
func (q *asyncQueue) drop(src eventSource) {
	if q == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	kept := q.pending[:0]
	for _, e := range q.pending {
		if e.src != src {
			kept = append(kept, e)
		}
	}
	clear(q.pending[len(kept):])
	q.pending = kept
	if !q.offering || q.offer.src != src {
		return
	}
	q.dropped = true
	n := q.offers
	q.kick()
	for q.offering && q.offers == n {
		q.turn.Wait()
	}
}

// close drops what is queued, refuses what comes later, and returns once
// the pump has.
func (q *asyncQueue) close() {
	q.mu.Lock()
	q.closed = true
	clear(q.pending)
	q.pending = nil
	q.mu.Unlock()
	close(q.stop)
	<-q.exited
}

// pump offers the queued events on out, oldest first, one at a time.
func (q *asyncQueue) pump() {
	defer close(q.exited)
	for {
		e, ok := q.next()
		if !ok {
			return
		}
		stopped := q.deliver(e.ev)
		q.mu.Lock()
		q.offering, q.dropped, q.offer = false, false, asyncEntry{}
		q.turn.Broadcast()
		q.mu.Unlock()
		if stopped {
			return
		}
	}
}

// next waits for an event and makes it the one offered; false on close.
func (q *asyncQueue) next() (asyncEntry, bool) {
	q.mu.Lock()
	for len(q.pending) == 0 {
		q.mu.Unlock()
		select {
		case <-q.wake:
		case <-q.stop:
			return asyncEntry{}, false
		}
		q.mu.Lock()
	}
	e := q.pending[0]
	q.pending[0] = asyncEntry{}
	q.pending = q.pending[1:]
	if len(q.pending) == 0 {
		q.pending = nil // let a burst's array go
	}
	q.offer, q.offering, q.dropped = e, true, false
	q.offers++
	q.turn.Broadcast()
	q.mu.Unlock()
	return e, true
}

// deliver offers ev until a reader takes it, a drop takes it back, or
// close (stopped). A wake for a post only makes it look again.
func (q *asyncQueue) deliver(ev AsyncEvent) (stopped bool) {
	for {
		select {
		case q.out <- ev:
			return false
		case <-q.wake:
			q.mu.Lock()
			dropped := q.dropped
			q.mu.Unlock()
			if dropped {
				return false
			}
		case <-q.stop:
			return true
		}
	}
}
