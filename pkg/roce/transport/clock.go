package transport

import (
	"sort"
	"sync"
	"time"
)

// Clock is the time source of the fault injector's delays, injectable so
// tests advance time instead of sleeping.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine (or, for ManualClock, in the
	// goroutine that advances the clock) once d has elapsed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call if it has not happened; it reports whether it
	// did so.
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// ManualClock is a Clock that moves only when Advance is called; due
// callbacks run synchronously inside Advance, in due-time order (ties in
// registration order). Safe for concurrent use.
type ManualClock struct {
	mu      sync.Mutex
	now     time.Time
	seq     uint64
	pending []*manualTimer
}

// NewManualClock returns a ManualClock reading start.
func NewManualClock(start time.Time) *ManualClock { return &ManualClock{now: start} }

type manualTimer struct {
	c   *ManualClock
	due time.Time
	seq uint64
	f   func()
}

// Now returns the clock's current time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc registers f to run when the clock has advanced by d.
func (c *ManualClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &manualTimer{c: c, due: c.now.Add(d), seq: c.seq, f: f}
	c.pending = append(c.pending, t)
	return t
}

// Pending returns the number of callbacks not yet run or stopped.
func (c *ManualClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// Advance moves the clock forward by d, running every callback that falls
// due, each with the clock set to its due time. Callbacks may register new
// ones; those due within the window run too.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		sort.Slice(c.pending, func(i, j int) bool {
			a, b := c.pending[i], c.pending[j]
			if !a.due.Equal(b.due) {
				return a.due.Before(b.due)
			}
			return a.seq < b.seq
		})
		if len(c.pending) == 0 || c.pending[0].due.After(end) {
			break
		}
		t := c.pending[0]
		c.pending = c.pending[1:]
		if t.due.After(c.now) {
			c.now = t.due
		}
		c.mu.Unlock()
		t.f()
		c.mu.Lock()
	}
	c.now = end
	c.mu.Unlock()
}

func (t *manualTimer) Stop() bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, p := range c.pending {
		if p == t {
			c.pending = append(c.pending[:i], c.pending[i+1:]...)
			return true
		}
	}
	return false
}
