package roce

import (
	"sync"
	"sync/atomic"
	"time"
)

// Waking a sleeping process on time for the engine's short timers.
//
// When every thread of a Go process sleeps, the runtime waits for its
// next timer in epoll_pwait, whose timeout is in whole milliseconds, and
// rounds a shorter wait up to one (runtime/netpoll_epoll.go: delay < 1e6
// -> waitms = 1). A worker's timer for a deadline 250 us away (the fast
// retransmit's minimum, recovery.go) then fires after about 1.1 ms
// whenever the process has gone idle meanwhile, which is exactly when a
// loss has stopped the traffic: `rxed perf write` at 5% loss over
// loopback spent 105 of its 174 ms in 103 silences of 0.5-1.6 ms (1.09 ms
// at the median), each a fast retransmit waiting out the rounding, and
// made 360-440 MB/s, against 890-960 with the tools busy-polling (whose
// spinning thread runs the timers on time) (docs/performance.md,
// session V).
//
// So the worker's timer, armed for less than idleWakeMax for a QP that
// is losing packets (qp.QP.LossRecent), also sets a one-shot alarm that
// the netpoller watches (a timerfd on Linux) for the earliest such
// deadline of the process (a little after it: alarmFor): when it goes
// off, the sleeping thread's epoll_pwait returns at once, and the
// runtime, awake, runs the timers that are due. No goroutine waits on the
// alarm; none needs to. Setting it is a system call, made only when the
// pending alarm does not fit that deadline any more (a stream's
// retransmit deadline, moving later with every ACK, needs one about
// every half wait), and nothing resets it when a deadline is stopped (it
// may go off once for nothing). Clean traffic never sets it: a latency
// benchmark's retransmit deadline moves with every round trip and is
// stopped at every completion, and the alarms left behind woke a thread
// every few hundred microseconds (a first version, for every QP: the p99
// of an 8-byte WRITE round trip went from 5 to 35 us).
//
// `rxed perf -s 65536 -n 5000` over loopback, 3 seeds alternating with
// the previous build, MB/s medians: at 5% loss WRITE 373 -> 639 and READ
// 311 -> 426 (MTU 4096), 92 -> 131 and 68 -> 104 (MTU 1024); at 1% the
// same at MTU 4096, 744 -> 835 and 741 -> 843 at MTU 1024.

// idleWakeMax is the longest timer the alarm is set for.
const idleWakeMax = 10 * time.Millisecond

// idleWaker keeps the process's alarm: one for the whole process, since
// the runtime, once awake, runs every timer that is due whichever P holds
// it.
type idleWaker struct {
	arm func(d time.Duration) error // the platform's one-shot alarm; set once
	// mu serialises setting the alarm (arm and at together).
	mu sync.Mutex
	at atomic.Int64 // when the pending alarm goes off (wakeClock ns); 0: none
	// timers holds the short deadline of every registered timer
	// (wakeClock ns; 0: none).
	timers cowList[*atomic.Int64]
}

// processWaker is the process's idle waker, made by the first engine on
// the SystemClock (systemWaker), not by every program that imports the
// package; nil where the platform has no alarm the netpoller can watch
// (its methods do nothing then).
var (
	wakerOnce    sync.Once
	processWaker *idleWaker
)

// systemWaker returns processWaker, making it the first time.
func systemWaker() *idleWaker {
	wakerOnce.Do(func() {
		if processWaker == nil {
			processWaker = newIdleWaker()
		}
	})
	return processWaker
}

// register adds a timer's deadline to those the alarm is set again for.
func (w *idleWaker) register(dl *atomic.Int64) {
	if w != nil {
		w.timers.add(dl)
	}
}

// unregister removes it (the engine closed).
func (w *idleWaker) unregister(dl *atomic.Int64) {
	if w != nil {
		w.timers.remove(dl)
	}
}

// wakeBy records that the registered timer dl is armed for deadline (a
// zero deadline: stopped, or not worth an alarm) and sets the alarm for
// the earliest short deadline of the registered timers if it is not set
// for that already; now is the caller's reading of the SystemClock (a
// real one: the arithmetic is on nanoseconds since processStart).
func (w *idleWaker) wakeBy(dl *atomic.Int64, now, deadline time.Time) {
	if w == nil {
		return
	}
	n := wakeClock(now)
	var d int64
	if !deadline.IsZero() {
		if d = wakeClock(deadline); d-n >= int64(idleWakeMax) {
			d = 0
		}
	}
	if d == 0 && dl.Load() == 0 {
		return // nothing was or is to be woken for: the clean path, one load
	}
	dl.Store(d)
	next := w.earliest(n)
	if _, set := alarmFor(w.at.Load(), n, next); !set {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	next = w.earliest(n)
	if at, set := alarmFor(w.at.Load(), n, next); set && w.arm(time.Duration(at-n)) == nil {
		w.at.Store(at)
	}
}

// alarmFor decides the alarm for the earliest short deadline next (0:
// none), now n, the pending alarm going off at pending: set is false when
// the pending one will do, going off no earlier than next (an earlier
// alarm would wake the runtime only to see the timer not yet due and
// sleep the rounded millisecond again) and no later than half the wait
// after it; else the alarm goes off at next plus half the wait. The
// slack spares a system call per deadline change when the deadline moves
// later with every ACK of a stream: it is set again only when the
// deadline has passed the alarm, about every half of the wait.
func alarmFor(pending, n, next int64) (at int64, set bool) {
	if next <= n {
		return pending, false
	}
	slack := (next - n) / 2
	if pending > n && pending >= next && pending <= next+slack {
		return pending, false
	}
	return next + slack, true
}

// earliest is the earliest registered deadline after n (0: none).
func (w *idleWaker) earliest(n int64) int64 {
	var next int64
	for _, dl := range w.timers.load() {
		if d := dl.Load(); d > n && (next == 0 || d < next) {
			next = d
		}
	}
	return next
}

// wakeClock is t in nanoseconds since processStart, the base of
// SystemClock's times (no clock is read).
func wakeClock(t time.Time) int64 { return int64(t.Sub(processStart)) }
