package kv

import (
	"context"
	"sync"
	"time"
)

// probeDeadline is the context of a client's wait for a response: its
// parent (the call's context) until probeAfter has passed, then done with
// context.DeadlineExceeded (waitSome turns that into errProbeDue). One per
// client, used for one wait at a time (begin, the wait, end).
//
// Why not context.WithTimeoutCause: it cost 4 allocations and about
// 0.4 us per PUT (the context, its timer, the cancel func), and almost
// every response comes well before the deadline. Here nothing is
// allocated per wait: the deadline is checked where the wait already
// looks (Err: HybridWaiter's spin asks it on every poll), and a timer is
// armed only when the wait is about to sleep (Done: CQ.WaitPoll asks for
// the channel just before it blocks): one time.AfterFunc per client,
// Reset for each wait that sleeps. The parent's end reaches a sleeping
// wait through one context.AfterFunc registration, kept while the calls'
// contexts share a Done channel (a client's calls under one context). A
// new channel is made only after one was closed: after a late response
// (a probe) or a cancellation.
type probeDeadline struct {
	parent   context.Context
	deadline time.Time // written by begin under mu; read by the client's goroutine and expire

	mu     sync.Mutex
	armed  bool          // the wait asked for Done: the timer runs or ch is closed
	ch     chan struct{} // Done's channel
	closed bool          // ch is closed: begin makes another
	timer  *time.Timer   // calls expire; nil until a wait first sleeps
	// watched is the parent Done channel that unwatch's registration
	// (context.AfterFunc) closes ch for.
	watched <-chan struct{}
	unwatch func() bool
}

// begin starts a wait under parent that is due after d.
func (p *probeDeadline) begin(parent context.Context, d time.Duration) context.Context {
	p.mu.Lock()
	p.parent, p.deadline = parent, time.Now().Add(d)
	if p.ch == nil || p.closed {
		p.ch, p.closed = make(chan struct{}), false
	}
	p.mu.Unlock()
	return p
}

// end ends the wait begun last; due says whether its deadline had passed.
func (p *probeDeadline) end() (due bool) {
	p.mu.Lock()
	if p.armed && p.timer != nil {
		p.timer.Stop() // one that already fired finds the next wait's later deadline (expire)
	}
	p.armed = false
	p.mu.Unlock()
	return !time.Now().Before(p.deadline)
}

// release drops the timer and the parent's registration (the client's
// Close).
func (p *probeDeadline) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.timer != nil {
		p.timer.Stop()
	}
	if p.unwatch != nil {
		p.unwatch()
		p.unwatch, p.watched = nil, nil
	}
}

// Done arms the deadline's timer and watches the parent: the wait is
// about to sleep.
func (p *probeDeadline) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed || p.closed {
		return p.ch
	}
	p.armed = true
	if p.parent.Err() != nil {
		p.closeLocked()
		return p.ch
	}
	if pd := p.parent.Done(); pd != p.watched {
		// Another parent: the old one's end must not close this wait.
		if p.unwatch != nil {
			p.unwatch()
			p.unwatch = nil
		}
		p.watched = pd
		if pd != nil {
			p.unwatch = context.AfterFunc(p.parent, func() { p.parentEnded(pd) })
		}
	}
	left := time.Until(p.deadline)
	if left <= 0 {
		p.closeLocked()
	} else if p.timer == nil {
		p.timer = time.AfterFunc(left, p.expire)
	} else {
		p.timer.Reset(left)
	}
	return p.ch
}

func (p *probeDeadline) closeLocked() {
	if !p.closed {
		close(p.ch)
		p.closed = true
	}
}

// expire is the timer's: it closes the armed wait's channel once that
// wait's deadline has passed. A timer that fired as the previous wait
// ended (Stop too late) finds a later deadline and does nothing.
func (p *probeDeadline) expire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed && !time.Now().Before(p.deadline) {
		p.closeLocked()
	}
}

// parentEnded is the parent's registration: a sleeping wait under it
// ends. One ended while no wait slept is seen by the next one (Done and
// Err ask the parent first).
func (p *probeDeadline) parentEnded(pd <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed && p.watched == pd {
		p.closeLocked()
	}
}

// Err is the parent's error, else DeadlineExceeded once the deadline has
// passed (checked against the clock: a spinning wait asks before any
// timer is armed).
func (p *probeDeadline) Err() error {
	if err := p.parent.Err(); err != nil {
		return err
	}
	if !time.Now().Before(p.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// Deadline is the earlier of the parent's and the probe's.
func (p *probeDeadline) Deadline() (time.Time, bool) {
	if d, ok := p.parent.Deadline(); ok && d.Before(p.deadline) {
		return d, true
	}
	return p.deadline, true
}

func (p *probeDeadline) Value(key any) any { return p.parent.Value(key) }
