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

// kernelTimed is a linkClock whose packets the kernel stamps as they
// arrive (SO_TIMESTAMPNS, arrivalLag): the real one. wallNow reads the
// wall clock those stamps are on; a test's fake clock has no kernel, and
// its packets are timed as read.
type kernelTimed interface {
	wallNow() time.Time
}

func (realClock) wallNow() time.Time { return time.Now() }

// arrivedAt is when a packet read at readAt (link time) arrived, lag
// before by its kernel stamp, but never before prev, when the packet
// ahead of it on the socket arrived (the kernel queues them in arrival
// order), nor before the link opened. The stamp is on the wall clock and
// link time is monotonic: a wall clock stepped forward between the two
// (NTP, a resumed VM) adds the step to lag, and an hour's step timed a
// packet an hour before the link opened (TestArrivalSurvivesAWallClockStep).
// One stepped back only shortens lag, which arrivalLag keeps at 0 or more.
func arrivedAt(readAt, lag, prev time.Duration) time.Duration {
	return max(prev, readAt-lag)
}

func (realClock) NewTimer(d time.Duration) linkTimer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }
