package ib

import (
	"errors"
	"sync"

	"github.com/rxed/rxed/pkg/qp"
)

// cqNotifier runs a CQ's user notification handler outside the engine.
//
// qp.CQ calls its handler in the engine goroutine that pushed the
// completion, while that goroutine owns the QP's shard; a handler that
// called a verb waiting for the engine (Modify, Query, Destroy, CreateQP)
// would wait for itself. So the qp-level handler only records that a
// notification is pending and, unless one is already running, starts a
// runner goroutine that calls fn until nothing is pending. A goroutine per
// burst instead of one per CQ for its lifetime: a program that never
// destroys its CQs (closing the device is enough for libibverbs) leaks
// nothing, and an idle CQ costs no goroutine.
type cqNotifier struct {
	mu      sync.Mutex
	fn      func(*CQ)
	pending bool // a notification fired since the runner last called fn
	running bool // a runner goroutine exists; at most one per CQ
	stopped bool // the CQ was destroyed
	chDone  bool // CQ.notifyCh is closed
	// run is cq.runNotify bound once, so starting a runner does not
	// allocate a closure per notification.
	run func()
	// onIdle, if set (tests), is called by a runner as it exits.
	onIdle func()
}

// errNotifyOnChannel refuses a handler on a CQ whose notifications go to
// a completion channel.
var errNotifyOnChannel = errors.New("ib: SetNotifyHandler: the CQ delivers its notifications to a completion channel")

// SetNotifyHandler installs fn to be called each time a notification of
// the CQ fires (after ReqNotify arms it, as with ibv_req_notify_cq), in
// place of reading Notify.
//
// fn runs on a goroutine of its own, never in the engine, so it may call
// any verb, including ones that wait for the engine (QP.Modify, QP.Query,
// QP.Destroy, PD.CreateQP) and ReqNotify and Poll on this CQ. Calls for
// one CQ never overlap, and notifications that fire while fn runs (or
// before it starts) coalesce into one more call, as events on a
// completion channel do; so the usual handler re-arms first and then
// polls the CQ empty. fn must not block forever: while it runs, this
// CQ's later notifications wait for it.
//
// nil removes the handler; so does Destroy. Neither waits for a call in
// progress (fn may itself destroy the CQ), but no call starts after they
// return. SetNotifyHandler fails with ErrDestroyed on a destroyed CQ,
// with ErrDeviceClosed after Device.Close, and
// on a CQ created with CreateCQOnChannel, whose notifications go to the
// channel.
func (cq *CQ) SetNotifyHandler(fn func(*CQ)) error {
	if cq.channel != nil {
		return errNotifyOnChannel
	}
	n := &cq.notify
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped || cq.d.down.Load() {
		if err := cq.emptyErr(); err != nil {
			return err
		}
		return errCQDestroyed
	}
	n.fn = fn
	if fn == nil {
		n.pending = false
		return nil
	}
	if n.run == nil {
		n.run = cq.runNotify
	}
	return nil
}

// fired is the qp-level handler, installed when the CQ is created: it
// runs in the engine goroutine that pushed the completion and must not
// block, so it only hands over: a token on Notify's channel, the CQ to
// its completion channel, a call to the runner of SetNotifyHandler.
func (cq *CQ) fired(*qp.CQ) {
	n := &cq.notify
	n.mu.Lock()
	if !n.chDone {
		select {
		case cq.notifyCh <- struct{}{}:
		default: // an event is already pending; like a comp channel it is not lost
		}
	}
	if !n.stopped && n.fn != nil {
		n.pending = true
		if !n.running {
			n.running = true
			go n.run()
		}
	}
	n.mu.Unlock()
	if cq.channel != nil {
		cq.channel.deliver(cq)
	}
}

// closeNotify closes Notify's channel, once.
func (cq *CQ) closeNotify() {
	n := &cq.notify
	n.mu.Lock()
	if !n.chDone {
		n.chDone = true
		close(cq.notifyCh)
	}
	n.mu.Unlock()
}

// runNotify calls the handler until no notification is pending.
func (cq *CQ) runNotify() {
	n := &cq.notify
	for {
		n.mu.Lock()
		if n.stopped || !n.pending || n.fn == nil {
			n.running = false
			idle := n.onIdle
			n.mu.Unlock()
			if idle != nil {
				idle()
			}
			return
		}
		n.pending = false
		fn := n.fn
		n.mu.Unlock()
		fn(cq)
	}
}

// stopNotify ends handler calls for a destroyed CQ: none starts after it
// returns.
func (cq *CQ) stopNotify() {
	n := &cq.notify
	n.mu.Lock()
	n.stopped = true
	n.fn = nil
	n.pending = false
	n.mu.Unlock()
}
