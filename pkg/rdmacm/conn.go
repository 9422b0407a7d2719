package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"sync"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/wire/mad"
)

// EventType is what happened to an established connection.
type EventType int

const (
	// EventDisconnected: the connection ended (the peer's DREQ or REJ,
	// our Disconnect answered or timed out, the CM's own DREQ to a stale
	// connection); Err says which (a *RejectError after a REJ). The QP is
	// in ERR.
	EventDisconnected EventType = iota + 1
	// EventTimewaitExit: the CM has forgotten the connection; its QP may
	// be destroyed or reused.
	EventTimewaitExit
)

func (t EventType) String() string {
	switch t {
	case EventDisconnected:
		return "DISCONNECTED"
	case EventTimewaitExit:
		return "TIMEWAIT_EXIT"
	}
	return "UNKNOWN"
}

// Event is one thing that happened to a Conn after it was established.
type Event struct {
	Type EventType
	Err  error
}

// Conn is one rdma_cm connection: a QP in RTS joined to a peer's.
//
// Its methods are safe for concurrent use. mu guards the fields below it;
// the CM's handler (onEvent) and the application's goroutines meet there.
type Conn struct {
	a      *agent
	id     *cm.ID
	qp     *ib.QP
	local  netip.AddrPort
	remote netip.AddrPort

	// hs carries the handshake's CM events to the goroutine in Dial or
	// Accept; once established nothing reads it.
	hs chan cm.Event

	events chan Event
	done   chan struct{}
	// settled is closed once the peer needs no more answers from us: our
	// DREQ was answered (also after the peer's crossed it:
	// cm.EventCrossedDREP), timewait ended, or the handshake failed. A
	// lingering device close waits for it (agent.close); a connection
	// that answered the peer's DREQ, and had no DREQ of its own answered,
	// stays unsettled through its timewait, in which a peer whose DREP
	// got lost retries.
	settled    chan struct{}
	settleOnce sync.Once

	mu          sync.Mutex
	established bool
	cmUp        bool   // the CM reported EventEstablished (onEvent's view)
	qpMoved     bool   // the handshake began moving the QP (ConnectQP): a failure moves it to ERR
	private     []byte // the peer's private data
	err         error  // why it ended
	ended       bool   // done is closed
	dreqSent    bool   // a Disconnect sent our DREQ: later ones wait for its answer
}

func newConn(a *agent, q *ib.QP) *Conn {
	c := &Conn{a: a, qp: q, hs: make(chan cm.Event, 16), events: make(chan Event, 4),
		done: make(chan struct{}), settled: make(chan struct{})}
	a.track(c)
	return c
}

// QP returns the connection's QP.
func (c *Conn) QP() *ib.QP { return c.qp }

// LocalAddr returns our address and port (rdma_cm's), RemoteAddr the
// peer's.
func (c *Conn) LocalAddr() netip.AddrPort { return c.local }

// RemoteAddr returns the peer's address and port.
func (c *Conn) RemoteAddr() netip.AddrPort { return c.remote }

// PrivateData returns the peer's private data: the REP's for a Dial, the
// REQ's (after rdma_cm's header) for an Accept, whole as on the wire.
func (c *Conn) PrivateData() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.private
}

// Done is closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended (nil while it is up).
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Events delivers EventDisconnected and EventTimewaitExit. Nothing waits
// for a reader: events beyond the channel's room (4) are dropped.
func (c *Conn) Events() <-chan Event { return c.events }

// Disconnect ends the connection as rdma_disconnect does: the QP goes to
// ERR (outstanding work completes with WR_FLUSH_ERR), a DREQ goes to the
// peer, and Disconnect returns once the peer's DREP arrived, the DREQ
// timed out, or ctx is done. Disconnecting an ended connection is a
// no-op.
func (c *Conn) Disconnect(ctx context.Context) error {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return nil
	}
	sent := c.dreqSent
	c.dreqSent = true
	c.mu.Unlock()
	// A second Disconnect waits for the answer to the first one's DREQ.
	// It used to send its own, which the CM refused (DREQ_SENT is not
	// ESTABLISHED), take that for the peer's crossing DREQ and end the
	// connection, so both returned before the DREP
	// (TestConcurrentDisconnectsWaitForTheDREP).
	if !sent {
		_ = c.qp.Modify(&ib.QPAttr{State: ib.QPSErr}, ib.AttrState)
		if err := c.id.Disconnect(nil); err != nil {
			// Not ESTABLISHED any more: the peer's DREQ crossed ours.
			if errors.Is(err, cm.ErrState) {
				c.end(ErrDisconnected)
				return nil
			}
			c.mu.Lock()
			c.dreqSent = false
			c.mu.Unlock()
			return err
		}
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return qp.ContextError(ctx)
	}
}

// onEvent is the cm.ID's handler. Before the connection is established it
// forwards the handshake to the waiting Dial or Accept; afterwards it
// ends the connection on the peer's DREQ or our DREQ's answer.
func (c *Conn) onEvent(ev cm.Event) {
	switch ev.Type {
	case cm.EventDREQ:
		c.qpToErr()
		c.end(ErrDisconnected)
		c.post(Event{Type: EventDisconnected, Err: ErrDisconnected})
		return
	case cm.EventDisconnected:
		err := ErrDisconnected
		if ev.Err != nil {
			err = ev.Err
		}
		// Disconnect moved the QP already, but the CM also sends a DREQ
		// of its own, to a connection the peer has forgotten (a REQ or
		// REP reusing its QPN): that QP must stop sending too.
		c.qpToErr()
		c.end(ErrDisconnected)
		c.post(Event{Type: EventDisconnected, Err: err})
		// Our DREQ was answered (or ran out of retries): the peer expects
		// nothing more of us, timewait or not.
		c.settle()
		return
	case cm.EventCrossedDREP:
		// Our DREQ crossed the peer's, which ended the connection
		// (EventDREQ), and has its DREP now: the peer had our DREQ, so
		// it cancelled its own and retries none, and needs no more
		// answers from us. Nothing to report: the connection ended
		// already.
		c.settle()
		return
	case cm.EventTimewaitExit:
		c.post(Event{Type: EventTimewaitExit})
		c.settle()
		return
	case cm.EventEstablished:
		c.mu.Lock()
		c.cmUp = true
		c.mu.Unlock()
	case cm.EventREJ:
		c.mu.Lock()
		up := c.cmUp
		c.mu.Unlock()
		if up {
			// A REJ for an established connection (the peer gave up in
			// REP_SENT, our RTU lost): the CM is in timewait, and
			// rdma_cm moves the QP to ERR and reports REJECTED.
			err := &RejectError{Reason: ev.Reason, PrivateData: ev.PrivateData}
			c.qpToErr()
			c.end(err)
			c.post(Event{Type: EventDisconnected, Err: err})
			c.settle()
			return
		}
	}
	c.mu.Lock()
	est := c.established
	c.mu.Unlock()
	if est {
		return
	}
	select {
	case c.hs <- ev:
	default:
		// The handshake has at most a handful of events; a full channel
		// means nobody waits any more (Dial gave up).
	}
}

// movingQP records that the handshake is about to move the QP (fail).
func (c *Conn) movingQP() {
	c.mu.Lock()
	c.qpMoved = true
	c.mu.Unlock()
}

// qpToErr moves the connection's QP to ERR (a no-op there already).
func (c *Conn) qpToErr() {
	if c.qp != nil {
		_ = c.qp.Modify(&ib.QPAttr{State: ib.QPSErr}, ib.AttrState)
	}
}

// post delivers an event without waiting for a reader.
func (c *Conn) post(ev Event) {
	select {
	case c.events <- ev:
	default:
	}
}

// setPrivate records the peer's private data.
func (c *Conn) setPrivate(private []byte) {
	c.mu.Lock()
	c.private = private
	c.mu.Unlock()
}

// setEstablished marks the handshake done: later CM events are the
// connection's, not the handshake's.
func (c *Conn) setEstablished() {
	c.mu.Lock()
	c.established = true
	c.mu.Unlock()
}

// end records why the connection ended and closes done, once.
func (c *Conn) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return
	}
	c.ended, c.err = true, err
	close(c.done)
}

// settle marks the connection as owing the peer nothing more, once.
func (c *Conn) settle() {
	c.settleOnce.Do(func() {
		c.a.untrack(c)
		close(c.settled)
	})
}

// fail ends a connection whose handshake failed: the CM ID is gone (or is
// destroyed here) and no timewait follows.
//
// A QP the handshake had begun to move (ConnectQP) goes to ERR, as
// rdma_cm's cma_modify_qp_err does when rdma_accept or cma_rep_recv fails
// and on a REJ: it must not go on sending to a peer that is not connected.
// One the handshake never touched is left as the caller gave it, so it
// can be dialled again.
func (c *Conn) fail(err error, destroy bool) {
	if destroy && c.id != nil {
		c.id.Destroy()
	}
	c.mu.Lock()
	moved := c.qpMoved
	c.mu.Unlock()
	if moved {
		c.qpToErr()
	}
	c.end(err)
	c.settle()
}

// await runs the rest of a handshake: onREP (active side) answers the
// REP; the ID's EventEstablished ends it; a REJ, a timeout, a DREQ or ctx
// fail it (the connection is then ended and its ID gone).
func (c *Conn) await(ctx context.Context, onREP func(*mad.REP) error) error {
	for {
		select {
		case <-ctx.Done():
			err := qp.ContextError(ctx)
			c.fail(err, true)
			return err
		case <-c.agentGone():
			c.fail(ib.ErrDeviceClosed, false)
			return ib.ErrDeviceClosed
		case <-c.done:
			if c.establishedQueued() {
				c.setEstablished()
				return nil
			}
			return c.Err()
		case ev := <-c.hs:
			switch ev.Type {
			case cm.EventREP:
				if onREP != nil {
					if err := onREP(ev.REP); err != nil {
						return err
					}
				}
			case cm.EventEstablished:
				c.setEstablished()
				return nil
			case cm.EventMRA:
				// The peer asked for more time; the CM extended the wait.
			default:
				if err := handshakeErr(ev); err != nil {
					c.fail(err, false)
					return err
				}
			}
		}
	}
}

// agentGone is closed once the device's CM stopped (agent.gone), after
// which no handshake event comes; nil (never ready) for a Conn without an
// agent (tests build one).
func (c *Conn) agentGone() <-chan struct{} {
	if c.a == nil {
		return nil
	}
	return c.a.gone
}

// establishedQueued reports whether the handshake's EventEstablished waits
// in hs, taking what is queued. The peer's DREQ ends a connection (closes
// done) as soon as it arrives, and a passive side that disconnects at once
// (ucmatose -C 0) sends it right after our RTU, so done can be closed while
// EventEstablished is still queued and select picks either: the connection
// was made, and rdma_cm reports ESTABLISHED, then DISCONNECTED (posted to
// Events by onEvent), not a failed connect.
func (c *Conn) establishedQueued() bool {
	for {
		select {
		case ev := <-c.hs:
			if ev.Type == cm.EventEstablished {
				return true
			}
		default:
			return false
		}
	}
}

// abandoned returns why the CM ended a handshake that a call of ours
// found in the wrong state (cm.ErrState): the event that ended it, which
// the CM delivers after the state change the call saw (a passive ID
// leaves REQ_RCVD only on the peer's REJ, or by our own hand). fallback
// if ctx ends first.
func (c *Conn) abandoned(ctx context.Context, fallback error) error {
	for {
		select {
		case ev := <-c.hs:
			if err := handshakeErr(ev); err != nil {
				return err
			}
		case <-c.agentGone():
			return ib.ErrDeviceClosed
		case <-ctx.Done():
			return fallback
		}
	}
}

// handshakeErr maps a CM event that ends a handshake to its error, or nil.
func handshakeErr(ev cm.Event) error {
	switch ev.Type {
	case cm.EventREJ:
		return &RejectError{Reason: ev.Reason, PrivateData: ev.PrivateData}
	case cm.EventTimeout:
		return ErrTimeout
	case cm.EventDREQ, cm.EventDisconnected:
		return ErrDisconnected
	}
	return nil
}
