// Package cmtest holds test helpers for pkg/cm and the packages built on it
// (pkg/rdmacm): a manual clock.
package cmtest

import (
	"sync"
	"time"

	"github.com/rxed/rxed/pkg/cm"
)

// FakeClock is a manual cm.Clock: time moves only with Advance, which runs
// the due callbacks in deadline order, each at its own deadline, in the
// goroutine that called Advance.
type FakeClock struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers []*fakeTimer // armed timers, unordered
}

var _ cm.Clock = (*FakeClock)(nil)

// NewFakeClock returns a clock standing at start.
func NewFakeClock(start time.Time) *FakeClock { return &FakeClock{now: start} }

// Now returns the clock's current time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc arms a callback that Advance runs once d has elapsed.
func (c *FakeClock) AfterFunc(d time.Duration, f func()) cm.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{c: c, at: c.now.Add(d), seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	return t
}

// Advance moves time forward by d. Every callback whose deadline falls
// within the step runs, earliest first (ties in arming order), with the
// clock standing at its deadline; callbacks armed by callbacks run too if
// they fall due within the step. The clock's lock is not held while a
// callback runs.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		t := c.earliestLocked()
		if t == nil || t.at.After(end) {
			break
		}
		c.removeLocked(t)
		if t.at.After(c.now) {
			c.now = t.at
		}
		c.mu.Unlock()
		t.f()
		c.mu.Lock()
	}
	c.now = end
	c.mu.Unlock()
}

// NextDeadline returns how long until the earliest armed callback, if any.
func (c *FakeClock) NextDeadline() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.earliestLocked()
	if t == nil {
		return 0, false
	}
	return t.at.Sub(c.now), true
}

// Pending returns the number of armed callbacks.
func (c *FakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

func (c *FakeClock) earliestLocked() *fakeTimer {
	var best *fakeTimer
	for _, t := range c.timers {
		if best == nil || t.at.Before(best.at) || (t.at.Equal(best.at) && t.seq < best.seq) {
			best = t
		}
	}
	return best
}

func (c *FakeClock) removeLocked(t *fakeTimer) bool {
	for i, u := range c.timers {
		if u == t {
			c.timers[i] = c.timers[len(c.timers)-1]
			c.timers[len(c.timers)-1] = nil
			c.timers = c.timers[:len(c.timers)-1]
			return true
		}
	}
	return false
}

type fakeTimer struct {
	c   *FakeClock
	at  time.Time
	seq uint64
	f   func()
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	return t.c.removeLocked(t)
}
