package roce

import (
	"runtime"
	"time"
)

// Busy polling in the receive goroutine (Config.BusyPoll).
//
// Without it the receive goroutine blocks in a receive call as soon as
// the socket is empty, and the kernel wakes its thread for the next
// datagram: 18-19 us here, and the CPU of two context switches, at every
// gap in the traffic. A stream has such gaps wherever the sender waits
// for the receiver: at every loss (the requester waits for the NAK, or
// its retransmit timer) and whenever the window fills. An application
// that spins on its CQ receives for the engine (ib.HybridWaiter keeps
// spinning while its device receives); one that idles while the engine
// serves, as rxed perf's WRITE and READ servers do (the responder has
// no completion to wait for), leaves every gap to those wake-ups.
//
// So with BusyPoll the receive goroutine, after each batch, polls the
// socket without blocking until the device has been silent for BusyPoll
// (another goroutine's receives count: an application's Progress), then
// blocks as before: Linux's SO_BUSY_POLL, with its trade (a CPU spent
// on polling while traffic flows, none once it stops). `rxed perf
// write|read -s 65536 --fault loss=0.01`, the server with a BusyPoll of
// 50 us (8 seeds alternating): WRITE 1.24x, READ 1.28x the goodput
// without; the READ latency tool's typical round trip 30 -> 12 us. On a
// host whose CPUs other work also wants, polling longer costs (two busy
// loops on the 2-core VM: READ at 1% 396 MB/s without, 398 with 50 us,
// 326 with 200 us), which is why the tools poll for one spin budget.

// pollWhileBusy is the receive loop's busy poll after a batch. Called
// without rxMu.
func (e *Engine) pollWhileBusy() {
	poll := func() int {
		if e.pollOnce(false) == 0 {
			// A worker, or the application, may have work on this CPU.
			runtime.Gosched()
		}
		return 0 // only silence (or Close) ends a busy poll
	}
	closed := func() bool {
		select {
		case <-e.closed:
			return true
		default:
			return false
		}
	}
	// Not SpinWhileBusy: the receive loop is no application waiting for
	// completions (spinners).
	spinWhileBusy(poll, e.ReceivedBatches, time.Now, closed, time.Now(), e.busyPoll, e.busyPoll)
}

// SpinWhileBusy calls poll until it returns more than 0, stop reports
// that the spin is over, or the engine has received nothing for long
// enough: budget while it has received nothing since the call, top after
// each batch it receives (by any goroutine: ReceivedBatches). It returns
// poll's last count and when the engine was last heard (the call's start
// if never). It is the one busy-spin of the engine's users: the receive
// loop's busy poll (budget and top both BusyPoll) and ib.HybridWaiter's
// (its budget, then MaxSpin after each batch). poll is typically a
// non-blocking receive, a system call, so a clock read per round costs
// little beside it.
//
// While it spins the caller counts as a spinner for the doorbell batch
// (doorbell.go).
func (e *Engine) SpinWhileBusy(poll func() int, stop func() bool, budget, top time.Duration) (n int, quiet time.Time) {
	e.spinners.Add(1)
	defer e.spinners.Add(-1)
	return spinWhileBusy(poll, e.ReceivedBatches, time.Now, stop, time.Now(), budget, top)
}

// spinWhileBusy is SpinWhileBusy with the engine's counter and the clock
// injected (TestSpinWhileBusy).
func spinWhileBusy(poll func() int, received func() uint64, now func() time.Time, stop func() bool, start time.Time, budget, top time.Duration) (n int, quiet time.Time) {
	seen, limit, quiet := received(), budget, start
	for {
		if n := poll(); n > 0 {
			return n, quiet
		}
		if stop() {
			return 0, quiet
		}
		t := now()
		if r := received(); r != seen {
			seen, quiet, limit = r, t, top
		}
		if t.Sub(quiet) >= limit {
			return 0, quiet
		}
	}
}
