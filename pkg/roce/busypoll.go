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
	seen := e.rxBatches.Load()
	quiet := nanotime()
	for {
		select {
		case <-e.closed:
			return
		default:
		}
		if e.pollOnce(false) == 0 {
			// A worker, or the application, may have work on this CPU.
			runtime.Gosched()
		}
		now := nanotime()
		if r := e.rxBatches.Load(); r != seen {
			seen, quiet = r, now
		}
		if time.Duration(now-quiet) >= e.busyPoll {
			return
		}
	}
}
