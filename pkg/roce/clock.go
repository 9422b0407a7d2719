package roce

import (
	"sync"
	"time"
)

// Clock is the engine's source of time, injected so that the retransmit
// and RNR timers can be driven deterministically in tests.
type Clock interface {
	Now() time.Time
	// NewTimer returns a stopped timer.
	NewTimer() Timer
}

// Timer is a resettable one-shot timer whose channel receives when it fires.
type Timer interface {
	C() <-chan time.Time
	// Reset arms the timer to fire after d, replacing any earlier arming.
	Reset(d time.Duration)
	Stop()
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns the time from the monotonic clock alone: processStart (the
// base nanotime reads from too) advanced by
// the monotonic time since it was taken. The engine only compares and
// subtracts its times (deadlines, windows), for which the monotonic reading
// is what time.Now would use too; reading the wall clock as well is a
// second vDSO call, and the engine reads its clock several times per round
// trip (docs/performance.md, session R). The wall-clock part drifts from
// time.Now's if the system clock is stepped, which nothing here reads.
func (SystemClock) Now() time.Time { return processStart.Add(time.Since(processStart)) }

// NewTimer returns a stopped time.Timer.
func (SystemClock) NewTimer() Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return sysTimer{t}
}

type sysTimer struct{ t *time.Timer }

func (s sysTimer) C() <-chan time.Time   { return s.t.C }
func (s sysTimer) Reset(d time.Duration) { s.t.Reset(d) }
func (s sysTimer) Stop()                 { s.t.Stop() }

// FakeClock is a manual clock for tests: time moves only with Advance,
// which fires every timer whose deadline has been reached.
type FakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

// NewFakeClock returns a clock standing at start.
func NewFakeClock(start time.Time) *FakeClock { return &FakeClock{now: start} }

// Now returns the clock's current time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer returns a stopped timer driven by Advance.
func (c *FakeClock) NewTimer() Timer {
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1)}
	c.mu.Lock()
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	return t
}

// Advance moves time forward by d and fires the timers that are due.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	now := c.now
	for _, t := range c.timers {
		if t.armed && !now.Before(t.at) {
			t.armed = false
			select {
			case t.ch <- now:
			default:
			}
		}
	}
	c.mu.Unlock()
}

// NextDeadline returns the earliest armed timer deadline, if any.
func (c *FakeClock) NextDeadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var best time.Time
	ok := false
	for _, t := range c.timers {
		if t.armed && (!ok || t.at.Before(best)) {
			best, ok = t.at, true
		}
	}
	return best, ok
}

type fakeTimer struct {
	c     *FakeClock
	ch    chan time.Time
	at    time.Time
	armed bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

// Reset arms the timer d after the clock's time. As with time.Timer, a
// d that is not positive fires it at once: the deadline has passed, and
// a later Advance may never come (a caller that re-arms for a deadline
// an Advance already overtook would otherwise wait for good).
func (t *fakeTimer) Reset(d time.Duration) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	// Drain a stale firing so Reset behaves like a fresh arming.
	select {
	case <-t.ch:
	default:
	}
	t.at = t.c.now.Add(d)
	t.armed = d > 0
	if !t.armed {
		t.ch <- t.c.now // drained above: room for one
	}
}

func (t *fakeTimer) Stop() {
	t.c.mu.Lock()
	t.armed = false
	t.c.mu.Unlock()
}
