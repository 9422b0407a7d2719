package main

import (
	"context"
	"flag"
	"sync/atomic"
	"time"

	"github.com/rxed/rxed/pkg/ib"
)

// How the tools wait for completions (--spin, -e).
//
// perftest and the ibv_*_pingpong tools busy-poll their CQ until the
// completion arrives. On a machine with a CPU per spinner and an idle
// peer that is the lowest latency there is, and rxed's Poll makes it
// better still: the spinning goroutine receives the engine's packets
// itself (ib.CQ.Poll, Engine.Progress). On a small machine it is the
// worst choice: the spinner holds a CPU that the peer (another process
// on loopback), the engine's own goroutines or anything else need for
// the very completion it waits for. Measured on the 2-core VM with other
// load: `rxed perf write -s 65536` at 0.45x the same run in-process, and
// send_lat tails of several milliseconds, all of it CPU starvation.
//
// The tools therefore wait hybrid by default (ib.HybridWaiter): they spin
// on Poll for a bounded budget and then sleep in WaitPoll until the
// engine's receive goroutine delivers. The budget adapts between --spin
// (defaultSpin) and 4 times it: a wait that slept but ended within
// 4 budgets would have been caught by spinning a little longer, so the
// budget doubles; one that slept longer than that halves it. A fixed
// budget shorter than a round trip in which the peer has to wake up
// (~50-60 us on the loaded VM against ~16 us for two spinners) locks
// both ends of a ping-pong into sleeping (measured: send_lat typical
// 67 us one way with 50 us fixed, 6.7 us with 200 us); the adaptive one
// leaves that state after a wait or two. A stream of fast completions
// keeps spinning, as long as the peer is not starved by it (then waits
// get long and the budget shrinks). A bandwidth run with completion
// moderation (~100 messages, milliseconds, between completions) spins as
// long as its device keeps receiving, doing the engine's receive work
// itself, and sleeps once the device has been silent for 4 budgets
// (ib.HybridWaiter): sleeping at the base budget instead handed every
// gap of a lossy stream to the receive goroutine's wake-ups. --spin -1
// is perftest's pure busy poll, --spin 0 (or -e) sleeps at once.

// defaultSpin is the tools' base spin budget before a wait sleeps.
const defaultSpin = ib.DefaultHybridSpin

// deviceBusyPoll is the device's BusyPoll (ib.Config, roce/busypoll.go)
// for a perf run: how long the engine's receive goroutine keeps polling
// its socket after a batch before it blocks in a receive. A device whose
// application polls it needs none (a hybrid or busy wait receives for
// the engine, and two pollers of one socket only contend); a device
// nobody polls was woken at every gap of the traffic, a thread wake-up
// each time (18-19 us on session G's VM, about 30 on session O's). Two
// such devices:
//
//   - the server of WRITE, READ and atomic bandwidth, and of READ and
//     atomic latency, which has no completion to wait for: the client
//     runs the test and the server's engine serves it;
//   - either end of a test with -e, whose application sleeps on CQ
//     events. -e says how the application waits (perftest's
//     ibv_get_cq_event); the device keeps the traffic flowing as rxe's
//     softirq does, polling while packets come and sleeping once they
//     stop. Measured, alternating: `rxed perf write -s 65536 -n 20000
//     -t 16 -Q 1 -e` 2754-3105 MB/s without, 3760-4233 with 50 us on
//     both ends, and less CPU (0.58-0.59 s per 40,000 messages for the
//     server against 0.70-0.72: a wake-up costs more than the polls it
//     replaces); send 2746-3165 -> 3846-4215, read 2920-3336 ->
//     4241-4414 (the server alone); `rxed perf send --lat -s 8 -n
//     100000 -e` 33-36 -> 4.8 us typical one way, 70-77 -> 6.5-15 us at
//     the 99th percentile, read 61-67 -> 7.0-7.2, write 60-61 -> 5.9
//     (whose 99th percentile was 600 us), and 10 us of CPU per round
//     trip and process instead of 39 (each completion woke a thread).
//
// The budget is the base spin budget (--spin, or the default's 50 us
// for --spin -1), not the 4 budgets a hybrid wait spins on a busy
// device: with two busy
// loops on the 2-core VM, `rxed perf read --fault loss=0.01` made 396
// MB/s without busy polling, 398 with 50 us and 326 with 200 us (6
// seeds), where on the idle VM 50 us and 200 us both gained (1484 ->
// 1838 and 1959). --spin 0 spins nothing, anywhere.
// idles says that the application never polls the device (a perf server
// that idles, oob.Test.ServerIdles).
func deviceBusyPoll(idles, events bool, spin time.Duration) time.Duration {
	budget := spin
	if spin < 0 {
		budget = defaultSpin
	}
	switch {
	case spin == 0:
		return 0
	case events, idles:
		return budget
	}
	return 0
}

// cqWaiter waits for completions in one of the three ways (busy poll,
// hybrid, events) with a stall timeout, without allocating per wait (a
// context.WithTimeout per completion was the event mode's only
// allocation per operation, and garbage makes latency tails). Not for
// concurrent use.
type cqWaiter struct {
	events  bool
	spin    time.Duration // < 0: spin until the completion; 0: sleep at once
	hybrid  ib.HybridWaiter
	timeout time.Duration
	parent  context.Context

	// ctx ends with parent, or for good when one sleeping wait took
	// longer than timeout (stalled, set by the stall timer).
	ctx     context.Context
	cancel  context.CancelFunc
	stall   *time.Timer
	stalled atomic.Bool
}

func newCQWaiter(ctx context.Context, events bool, spin, timeout time.Duration) *cqWaiter {
	w := &cqWaiter{events: events, spin: spin, hybrid: ib.HybridWaiter{Spin: spin}, timeout: timeout, parent: ctx}
	w.ctx, w.cancel = context.WithCancel(ctx)
	w.stall = time.AfterFunc(time.Hour, func() {
		w.stalled.Store(true)
		w.cancel()
	})
	w.stall.Stop()
	return w
}

// close releases the waiter's context.
func (w *cqWaiter) close() {
	w.stall.Stop()
	w.cancel()
}

// next returns cq's next completions: spinning for the adaptive budget,
// then sleeping (events or --spin 0: sleeping at once; --spin -1:
// spinning until it comes). It returns context.DeadlineExceeded when no
// completion came within the timeout, and the parent context's error
// when it ends.
func (w *cqWaiter) next(cq *ib.CQ, wcs []ib.WC) (int, error) {
	if n := cq.Poll(wcs); n > 0 {
		return n, nil
	}
	if !w.events && w.spin < 0 {
		return w.spinForever(cq, wcs)
	}
	if w.stalled.Load() {
		return 0, context.DeadlineExceeded
	}
	w.stall.Reset(w.timeout)
	var n int
	var err error
	if w.events || w.spin == 0 {
		n, err = cq.WaitPoll(w.ctx, wcs)
	} else {
		n, err = w.hybrid.Wait(w.ctx, cq, wcs)
	}
	w.stall.Stop()
	if err != nil && w.stalled.Load() && w.parent.Err() == nil {
		return 0, context.DeadlineExceeded
	}
	return n, err
}

// spinForever is perftest's busy poll: Poll until a completion comes,
// checking the parent context and the timeout now and then.
func (w *cqWaiter) spinForever(cq *ib.CQ, wcs []ib.WC) (int, error) {
	start := time.Now()
	for spins := 1; ; spins++ {
		if n := cq.Poll(wcs); n > 0 {
			return n, nil
		}
		if spins&1023 == 0 {
			if err := w.parent.Err(); err != nil {
				return 0, err
			}
			if time.Since(start) > w.timeout {
				return 0, context.DeadlineExceeded
			}
		}
	}
}

// nextCompletions returns cq's next completions, failing after timeout:
// a cqWaiter for one wait (it allocates; loops keep a cqWaiter).
func nextCompletions(ctx context.Context, cq *ib.CQ, wcs []ib.WC, events bool, spin, timeout time.Duration) (int, error) {
	if n := cq.Poll(wcs); n > 0 {
		return n, nil
	}
	w := newCQWaiter(ctx, events, spin, timeout)
	defer w.close()
	return w.next(cq, wcs)
}

// waiterSpin maps the tools' --spin to the Spin of an example's config
// (kv.RDMAClientConfig, allreduce.Config), an ib.HybridWaiter's: 0 (sleep
// at once) is the waiter's negative, and -1 (never sleep) a budget no
// wait reaches (the wait still ends with its context).
func waiterSpin(spin time.Duration) time.Duration {
	switch {
	case spin == 0:
		return -1
	case spin < 0:
		return spinForever
	}
	return spin
}

// spinForever is the waiter's budget for --spin -1.
const spinForever = 24 * time.Hour

// registerSpin adds --spin, for the commands that wait for completions.
func (e *engineFlags) registerSpin(fs *flag.FlagSet) {
	e.registerSpinUsage(fs, "busy-poll the CQ this long before sleeping until the completion arrives (`duration`; -1: never sleep, perftest's pure busy poll; 0: sleep at once, as -e; the budget adapts up to 4 times this)")
}

// registerSpinUsage adds --spin (default defaultSpin, -1 accepted) with
// a command's own usage text.
func (e *engineFlags) registerSpinUsage(fs *flag.FlagSet, usage string) {
	e.spin = defaultSpin
	fs.Var((*spinFlag)(&e.spin), "spin", usage)
}

// spinFlag is a duration that also accepts -1 (spin forever).
type spinFlag time.Duration

func (f *spinFlag) String() string {
	if *f < 0 {
		return "-1"
	}
	return time.Duration(*f).String()
}

func (f *spinFlag) Set(s string) error {
	if s == "-1" {
		*f = -1
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if d < 0 {
		d = -1
	}
	*f = spinFlag(d)
	return nil
}
