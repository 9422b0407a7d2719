package ib

import (
	"context"
	"time"
)

// DefaultHybridSpin is HybridWaiter's base spin budget when Spin is 0:
// longer than a loopback round trip between two spinning ends (~15-25
// us on the 2-core VM), so a latency-bound loop finds its completion
// while spinning.
const DefaultHybridSpin = 50 * time.Microsecond

// HybridWaiter waits for completions the hybrid way: it spins on
// CQ.Poll (which receives the device's packets in the calling goroutine)
// for a bounded budget and then sleeps in CQ.WaitPoll until the engine's
// receive goroutine delivers. Pure spinning (perftest's default) holds a
// CPU that, on a machine with few of them, the peer or the engine's own
// goroutines need for the very completion being waited for; pure sleeping
// costs a goroutine wake-up per completion. The hybrid costs neither
// when completions come fast, and at most about a quarter of each wait
// in spinning when they come slowly and the device is silent meanwhile.
// While the device keeps receiving, the spinner keeps spinning: its Poll
// is then the engine's receive path, doing work the receive goroutine
// would otherwise be woken for, and it sleeps once the device has been
// silent for MaxSpin (roce.Engine.SpinWhileBusy).
//
// The budget adapts between Spin and MaxSpin: a wait that slept but
// ended within four budgets would have been caught by spinning somewhat
// longer, so the budget doubles; a wait that slept longer halves it. A
// fixed budget shorter than the round trip of a peer that has to wake up
// (~50-60 us on the loaded VM) would lock both ends of a ping-pong into
// sleeping; the adaptive one leaves that state within a wait or two.
//
// The budget is bounded (MaxSpin) because a goroutine spinning on Poll
// hides the network poller from the Go scheduler: Poll yields with
// runtime.Gosched, which requeues the spinner where the scheduler finds
// it before it looks at the netpoller, so while every P runs a spinner
// (2 CPUs: two spinning ends in one process) a goroutine waiting for a
// socket, such as another device's receive loop that a sleeping waiter
// depends on, is only woken when a spin ends (or by sysmon after up to
// 10 ms). Measured in-process (BenchmarkSendLatency8/hybrid) with a
// 16x bound: p99 862 us, the bound plus one round trip.
//
// A HybridWaiter keeps that state between waits, so a loop uses one for
// all of its waits. It is not safe for concurrent use (one per waiting
// goroutine); its zero value uses DefaultHybridSpin.
type HybridWaiter struct {
	// Spin is the base budget of spinning before a wait sleeps; 0 is
	// DefaultHybridSpin, negative means never spin (WaitPoll at once).
	Spin time.Duration
	// MaxSpin bounds the adaptive budget; 0 is 4 times Spin (see below).
	MaxSpin time.Duration

	budget time.Duration // current budget; 0 until the first wait
}

// Wait returns at least one completion of cq, spinning on Poll while
// the device is busy or for the current budget, then waiting in
// WaitPoll. Its errors are WaitPoll's: ctx's error when ctx ends while
// it sleeps, ErrCQOverflow, ErrDestroyed or ErrDeviceClosed once the CQ
// is empty (a spinning Wait notices them at its next empty Poll).
func (h *HybridWaiter) Wait(ctx context.Context, cq *CQ, wcs []WC) (int, error) {
	if n := cq.Poll(wcs); n > 0 {
		return n, nil
	}
	base, top := h.limits()
	if h.budget == 0 || h.budget < base || h.budget > top { // first wait, or Spin changed
		h.budget = base
	}
	var quiet time.Time
	if base > 0 {
		var n int
		poll := func() int { return cq.Poll(wcs) }
		// A busy device no longer ends the spin by itself: WaitPoll
		// reports these.
		stop := func() bool { return ctx.Err() != nil || cq.pollErr() != nil }
		// Why a busy device keeps the spinner: when the spinner sleeps,
		// the engine's receive goroutine takes over its packets and is
		// itself woken (18-19 us here, and the CPU of a context switch)
		// after every silence, until the next completion wakes the
		// application, which with the tools' completion moderation is
		// ~100 messages later. A stream with loss has such silences at
		// every gap (the requester waits for the NAK, or for its
		// retransmit timer): `rxed perf write -s 65536 --fault
		// loss=0.01` spent 10,000 context switches where a clean run
		// spends 2,200, and its spinner slept after 50 us of each wait:
		// busy polling (`--spin -1`) made 24-34% more of the same runs.
		// Silences between the batches of a live stream measured 10 us
		// to 640 us, nearly all under 320 us; one longer than MaxSpin
		// (200 us by default) still ends the spin, so a device that goes
		// quiet costs at most that, as a silent one costs the budget.
		n, quiet = cq.d.eng.SpinWhileBusy(poll, stop, h.budget, top)
		if n > 0 {
			return n, nil
		}
	}
	n, err := cq.WaitPoll(ctx, wcs)
	if err == nil && base > 0 {
		h.adapt(time.Since(quiet), base, top)
	}
	return n, err
}

// adapt sets the budget after a wait that spun until the device was
// silent for its limit, slept, and took waited since the device was last
// heard (or since it began).
func (h *HybridWaiter) adapt(waited, base, top time.Duration) {
	if waited < 4*h.budget {
		h.budget = min(2*h.budget, top)
	} else {
		h.budget = max(h.budget/2, base)
	}
}

// Budget returns the current spin budget (the base before the first
// wait; 0 when the waiter never spins).
func (h *HybridWaiter) Budget() time.Duration {
	if base, _ := h.limits(); h.budget == 0 || base == 0 {
		return base
	}
	return h.budget
}

// limits returns the base and the largest budget (0, 0: never spin).
func (h *HybridWaiter) limits() (base, top time.Duration) {
	base = h.Spin
	switch {
	case base < 0:
		return 0, 0
	case base == 0:
		base = DefaultHybridSpin
	}
	top = h.MaxSpin
	if top <= 0 {
		top = 4 * base
	}
	return base, max(top, base)
}
