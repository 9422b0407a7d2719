package conform

import (
	"sync"
	"time"
)

// fakeClock is a linkClock a test drives: its time moves only by Advance.
// The test can wait until a scenario arms a timer (it waits, having read
// everything queued: Link.Next arms one only then) and until a timer that
// fired is stopped (the scenario took the timeout and left its wait), so
// "the peer sent it after the scenario's window" is an order of events,
// not a race between sleeps.
type fakeClock struct {
	mu     sync.Mutex
	cond   *sync.Cond
	now    time.Time
	timers []*fakeTimer
	closed bool
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	ch      chan time.Time
	fired   bool
	stopped bool
}

func newFakeClock() *fakeClock {
	c := &fakeClock{now: time.Unix(1_000_000, 0)}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) linkTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), ch: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	c.cond.Broadcast()
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.fired && !t.stopped
	t.stopped = true
	t.c.cond.Broadcast()
	return was
}

// Advance moves the time on by d and fires the timers that are due; it
// returns them.
func (c *fakeClock) Advance(d time.Duration) []*fakeTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	var fired []*fakeTimer
	for _, t := range c.timers {
		if !t.fired && !t.stopped && !t.at.After(c.now) {
			t.fired = true
			t.ch <- c.now
			fired = append(fired, t)
		}
	}
	return fired
}

// armed waits until a timer is armed (neither fired nor stopped) and
// returns it; nil once the clock is closed.
func (c *fakeClock) armed() *fakeTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	for !c.closed {
		for _, t := range c.timers {
			if !t.fired && !t.stopped {
				return t
			}
		}
		c.cond.Wait()
	}
	return nil
}

// waitStopped waits until t is stopped or the clock is closed.
func (c *fakeClock) waitStopped(t *fakeTimer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for !t.stopped && !c.closed {
		c.cond.Wait()
	}
}

// close releases every waiter.
func (c *fakeClock) close() {
	c.mu.Lock()
	c.closed = true
	c.cond.Broadcast()
	c.mu.Unlock()
}
