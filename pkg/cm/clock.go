package cm

import "time"

// Clock is the Manager's source of time, injected so that the CM's
// retransmission and timewait timers can be driven deterministically in
// tests (cmtest.FakeClock). It has pkg/roce's Now, but timers are
// callbacks rather than channels: a CM timer fires rarely and only needs to
// run one short state step, so there is no goroutine to wait on a channel.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine (the fake clock: in the
	// goroutine that advances it) once d has elapsed, unless the returned
	// Timer is stopped first.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether
	// it did. The Manager never relies on the result: every callback
	// also checks a generation number under the Manager's lock, so a
	// callback that was already on its way does nothing.
	Stop() bool
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// AfterFunc is time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
