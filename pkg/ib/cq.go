package ib

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"

	"github.com/rxed/rxed/pkg/qp"
)

// CQ is a completion queue (struct ibv_cq), from Device.CreateCQ or
// Device.CreateCQOnChannel. Completions are taken off with Poll or
// PollCQ (never blocking), Wait and WaitPoll (blocking), or after a
// notification armed with ReqNotify (Notify, SetNotifyHandler, a
// CompChannel).
//
// Goroutine safety: every method may be called from any goroutine and
// concurrently with the others and with the engine completing work; two
// goroutines polling one CQ each get distinct completions (in queue
// order overall). Destroy may race with waiters, which then return
// ErrDestroyed.
type CQ struct {
	c     *qp.CQ // the queue; never exposed: Push and Close are the engine's and Destroy's
	d     *Device
	users useCount // QPs using the CQ; Destroy refuses while any does, and retires it

	channel  *CompChannel  // set at creation by CreateCQOnChannel
	released atomic.Bool   // the channel was told of Destroy
	notify   cqNotifier    // SetNotifyHandler's state and Notify's channel
	notifyCh chan struct{} // Notify; closed (under notify.mu) by Destroy and Device.Close

	spin spinYield // Poll's own yields (cq_spin.go)
}

// CreateCQ creates a completion queue of at least cqe entries
// (ibv_create_cq).
func (d *Device) CreateCQ(cqe int) (*CQ, error) {
	return d.newCQ(cqe, nil)
}

// newCQ creates a CQ whose notifications also go to ch, if not nil.
func (d *Device) newCQ(cqe int, ch *CompChannel) (*CQ, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	c, err := qp.NewCQ(cqe)
	if err != nil {
		return nil, wrap("CreateCQ", err)
	}
	cq := &CQ{c: c, d: d, channel: ch, notifyCh: make(chan struct{}, 1)}
	cq.users.what = "CQ"
	// The one qp-level handler, for the CQ's whole life: it feeds Notify,
	// the completion channel and SetNotifyHandler's runner.
	c.SetNotifyHandler(cq.fired)
	d.mu.Lock()
	defer d.mu.Unlock()
	// Close marks the device down before it collects the CQs under mu:
	// a CQ added here is either collected or refused.
	if d.down.Load() {
		return nil, ErrDeviceClosed
	}
	if d.cqs == nil {
		d.cqs = make(map[*CQ]struct{})
	}
	d.cqs[cq] = struct{}{}
	return cq, nil
}

// Destroy destroys the CQ (ibv_destroy_cq). It fails with ErrBusy,
// changing nothing, while QPs use the CQ. Waiters wake with ErrDestroyed,
// Notify's channel is closed, no notification handler call starts after
// it returns, and the CQ's events not yet read from its completion
// channel are dropped (GetCQEvent never returns a destroyed CQ), as are
// its EventCQErr not yet read from Device.Events. It does not wait for
// events to be acknowledged: there is no ibv_ack_cq_events.
// Completions still queued can be polled. Destroying a CQ twice is
// harmless.
func (cq *CQ) Destroy() error {
	first, err := cq.users.retire()
	if err != nil || !first {
		return err
	}
	cq.d.mu.Lock()
	delete(cq.d.cqs, cq)
	cq.d.mu.Unlock()
	// retire above made eventsGone true: no CQ_ERR of it is queued now.
	cq.d.async.drop(cq)
	cq.wake()
	cq.stopNotify()
	if cq.channel != nil && !cq.released.Swap(true) {
		cq.channel.release(cq)
	}
	return nil
}

// wake ends every wait on the CQ for good (Destroy, Device.Close): the
// queue refuses further completions, blocked Waits return, Notify's
// channel is closed.
func (cq *CQ) wake() {
	cq.c.Close()
	cq.closeNotify()
}

// cqSink forwards completions to a CQ and raises the CQ error event on
// overflow, as rxe_cq_post does.
type cqSink struct{ cq *CQ }

func (s cqSink) Push(wc qp.WC) error {
	err := s.cq.c.Push(wc)
	if errors.Is(err, qp.ErrCQOverflow) {
		s.cq.d.post(AsyncEvent{Type: EventCQErr, CQ: s.cq}, s.cq)
	}
	return err
}

// Poll takes up to len(wcs) completions off the queue (ibv_poll_cq) and
// returns how many it took. When there are none it first receives and
// handles what the device's socket has queued (Device.Progress, after
// the same for the process's other devices: roce.ProgressWithOthers) and
// looks again: an application that spins on Poll, as a busy-polling
// RDMA application does, receives its own packets instead of waiting for
// the engine's receive goroutine to be woken.
//
// Poll has no error: a spinner that must notice the device closing (or
// the CQ failing) uses PollCQ, which is Poll with one.
func (cq *CQ) Poll(wcs []WC) int {
	cq.spin.maybeYield()
	if n := cq.c.Poll(wcs); n > 0 || len(wcs) == 0 {
		return n
	}
	if cq.d.down.Load() {
		return 0
	}
	if cq.d.eng.ProgressWithOthers() == 0 {
		// A goroutine spinning on Poll must not keep a worker or timer
		// goroutine of the engine from running on a machine with few
		// CPUs: that work is what the completion it waits for needs.
		runtime.Gosched()
		return 0
	}
	return cq.c.Poll(wcs)
}

// PollCQ is Poll that also says when the CQ cannot be trusted to deliver
// what its QPs complete: once the queue is empty it returns
// ErrCQOverflow if a completion was ever lost because the CQ was full
// (IBA's CQ error, also raised as EventCQErr), ErrDeviceClosed after
// Device.Close and ErrDestroyed after Destroy. Completions queued before
// any of these are returned first, with a nil error.
func (cq *CQ) PollCQ(wcs []WC) (int, error) {
	if n := cq.Poll(wcs); n > 0 || len(wcs) == 0 {
		return n, nil
	}
	return 0, cq.pollErr()
}

// pollErr is why an empty CQ is not worth waiting on, or nil.
func (cq *CQ) pollErr() error {
	if err := cq.emptyErr(); err != nil {
		return err
	}
	if cq.c.Overflowed() {
		return errCQOverflowed
	}
	return nil
}

// errCQOverflowed is the error of an overflowed CQ's polls.
var errCQOverflowed = errorf(ErrCQOverflow, "ib: CQ overflowed: completions were lost (IBV_EVENT_CQ_ERR); size the CQ for every outstanding work request")

// emptyErr is why an empty CQ cannot be waited on, or nil.
func (cq *CQ) emptyErr() error {
	switch {
	case cq.d.down.Load():
		return ErrDeviceClosed
	case cq.users.retired():
		return errCQDestroyed
	}
	return nil
}

// errCQDestroyed is ErrDestroyed for a CQ.
var errCQDestroyed = errorf(ErrDestroyed, "ib: CQ destroyed")

// waitErr maps the errors of the underlying queue's waits to this
// package's.
func (cq *CQ) waitErr(err error) error {
	if errors.Is(err, qp.ErrCQClosed) {
		if e := cq.emptyErr(); e != nil {
			return e
		}
		return errCQDestroyed
	}
	return err
}

// Wait blocks until the CQ holds at least one completion and returns
// nil; the completion may still be taken by a concurrent Poll before the
// caller polls. It returns ctx's error when ctx ends first, ErrDestroyed
// when the CQ is destroyed and ErrDeviceClosed when the device closes;
// on an empty CQ that overflowed it returns ErrCQOverflow at once.
// Wait does not receive packets itself; WaitPoll does.
func (cq *CQ) Wait(ctx context.Context) error {
	if cq.c.Len() == 0 {
		if err := cq.pollErr(); err != nil {
			return err
		}
	}
	if err := cq.c.Wait(ctx); err != nil {
		return cq.waitErr(err)
	}
	return nil
}

// WaitPoll returns at least one completion, waiting for it if none is
// queued, like ibv_get_cq_event followed by ibv_poll_cq. Before it
// sleeps it receives and handles what the device's socket has queued,
// and those of the process's other devices that no application is
// polling or waiting on, as Poll does, so the engines make progress in
// this goroutine (an in-process round trip can then complete without a
// sleep); when that found nothing it hands the sockets back to their
// receive goroutines and sleeps (roce.Engine.ProgressBeforeSleep). It
// returns an error instead when ctx ends (ctx's error), when wcs is
// empty, and once the CQ is empty after an overflow (ErrCQOverflow),
// after Destroy (ErrDestroyed) or after Device.Close (ErrDeviceClosed).
func (cq *CQ) WaitPoll(ctx context.Context, wcs []WC) (int, error) {
	return cq.waitPoll(ctx, wcs, true)
}

// waitPoll is WaitPoll; attended says that the caller's sleep counts as
// an application waiting on the device (roce.Engine.BeginSleep), which
// keeps other devices' waits from handling its packets for it. The MAD
// agent's receive loop sleeps unattended: it waits for the occasional MAD
// whatever the device's applications do.
func (cq *CQ) waitPoll(ctx context.Context, wcs []WC, attended bool) (int, error) {
	if len(wcs) == 0 {
		return 0, errors.New("ib: WaitPoll: no room for a completion in wcs")
	}
	for {
		if n := cq.c.Poll(wcs); n > 0 {
			return n, nil
		}
		if err := cq.pollErr(); err != nil {
			return 0, err
		}
		if cq.d.eng.ProgressBeforeSleep() > 0 {
			// It found work and will not sleep: a caller whose every
			// wait finds its answer this way never blocks, and must
			// yield as a spinner on Poll does (cq_spin.go).
			cq.spin.maybeYield()
			continue
		}
		if attended {
			cq.d.eng.BeginSleep()
		}
		err := cq.c.Wait(ctx)
		if attended {
			cq.d.eng.EndSleep()
		}
		if err != nil {
			if n := cq.c.Poll(wcs); n > 0 {
				return n, nil
			}
			return 0, cq.waitErr(err)
		}
	}
}

// ReqNotify arms the CQ for one notification, like ibv_req_notify_cq:
// with solicitedOnly the next solicited or unsuccessful completion fires
// it, otherwise the next completion of any kind. Completions already
// queued do not fire it. It fails with ErrDestroyed after Destroy and
// ErrDeviceClosed after Device.Close.
func (cq *CQ) ReqNotify(solicitedOnly bool) error {
	if err := cq.emptyErr(); err != nil {
		return err
	}
	if err := cq.c.ReqNotify(solicitedOnly); err != nil {
		return cq.waitErr(err)
	}
	return nil
}

// Notify returns the channel a fired notification is delivered on, like
// a completion channel read with ibv_get_cq_event. It has room for one
// event: notifications fired while one is pending merge into it. It is
// closed when the CQ is destroyed or the device closes, so a goroutine
// blocked on it wakes (and its next ReqNotify says why).
func (cq *CQ) Notify() <-chan struct{} { return cq.notifyCh }

// Len returns the number of completions waiting to be polled.
func (cq *CQ) Len() int { return cq.c.Len() }

// Cap returns the number of completions the CQ holds (at least the cqe
// it was created with).
func (cq *CQ) Cap() int { return cq.c.Cap() }

// Resize changes the CQ's capacity to cqe, keeping the queued
// completions in order (ibv_resize_cq). It fails, changing nothing, with
// ErrCQSize when cqe is out of range or smaller than the number queued,
// and after Destroy or Device.Close.
func (cq *CQ) Resize(cqe int) error {
	if err := cq.emptyErr(); err != nil {
		return err
	}
	if err := cq.c.Resize(cqe); err != nil {
		return cq.waitErr(err)
	}
	return nil
}

// Overflowed reports whether a completion was ever lost because the CQ
// was full. The flag is sticky: such a CQ stays in error (IBA's CQ
// error); PollCQ and WaitPoll return ErrCQOverflow once it is empty.
func (cq *CQ) Overflowed() bool { return cq.c.Overflowed() }

// Notifications returns how many notifications have fired since the CQ
// was created.
func (cq *CQ) Notifications() uint64 { return cq.c.Notifications() }
