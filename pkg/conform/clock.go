package conform

import "time"

// linkClock is a Link's time: when the peer's packets arrive (Rx.At, the
// trace) and how long a scenario waits for one (Next, Collect). Real time
// outside tests; a test drives a fake one, so that "the peer answered
// after the window" is an event it orders, not a sleep it hopes is long
// enough.
type linkClock interface {
	Now() time.Time
	NewTimer(d time.Duration) linkTimer
}

// linkTimer is a one-shot timer of a linkClock.
type linkTimer interface {
	C() <-chan time.Time
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) linkTimer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }
