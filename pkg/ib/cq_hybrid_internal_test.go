package ib

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHybridBudgetAdapts: a wait that slept but ended within four
// budgets doubles the budget up to MaxSpin; a longer one halves it down
// to Spin.
func TestHybridBudgetAdapts(t *testing.T) {
	const us = time.Microsecond
	h := &HybridWaiter{Spin: 10 * us, MaxSpin: 70 * us}
	base, top := h.limits()
	require.Equal(t, 10*us, base)
	require.Equal(t, 70*us, top)
	h.budget = base
	steps := []struct {
		waited, want time.Duration
	}{
		{39 * us, 20 * us},  // < 4*10: grow
		{79 * us, 40 * us},  // < 4*20
		{100 * us, 70 * us}, // < 4*40, capped at MaxSpin
		{279 * us, 70 * us}, // < 4*70, stays at the cap
		{280 * us, 35 * us}, // >= 4*70: shrink
		{1 * time.Second, 17500 * time.Nanosecond},
		{1 * time.Second, 10 * us}, // not below Spin
		{1 * time.Second, 10 * us},
	}
	for i, s := range steps {
		h.adapt(s.waited, base, top)
		require.Equal(t, s.want, h.budget, "step %d (waited %v)", i, s.waited)
	}
}

// TestHybridLimits: the zero value spins DefaultHybridSpin up to 4
// times that; a negative Spin never spins; MaxSpin below Spin is Spin.
func TestHybridLimits(t *testing.T) {
	for _, c := range []struct {
		h         HybridWaiter
		base, top time.Duration
	}{
		{HybridWaiter{}, DefaultHybridSpin, 4 * DefaultHybridSpin},
		{HybridWaiter{Spin: -1}, 0, 0},
		{HybridWaiter{Spin: 5 * time.Microsecond}, 5 * time.Microsecond, 20 * time.Microsecond},
		{HybridWaiter{Spin: 5 * time.Microsecond, MaxSpin: time.Microsecond}, 5 * time.Microsecond, 5 * time.Microsecond},
	} {
		base, top := c.h.limits()
		require.Equal(t, c.base, base, "%+v", c.h)
		require.Equal(t, c.top, top, "%+v", c.h)
		require.Equal(t, c.base, c.h.Budget(), "%+v before any wait", c.h)
	}
}

// TestSpinWhileBusy: a wait spins for the budget on a silent device, and
// for MaxSpin after each batch a busy one receives, so a device that keeps
// receiving keeps the spinner (the lossy stream whose spinner slept at
// every gap: `rxed perf write --fault loss=0.01` made 24-34% less than
// with busy polling, for the receive goroutine's wake-ups). The clock
// moves 1 us per poll; receives and the completion come at the scripted
// polls.
func TestSpinWhileBusy(t *testing.T) {
	const us = time.Microsecond
	start := time.Unix(1000, 0)
	for _, c := range []struct {
		name        string
		budget, top time.Duration
		rxAt        []int // polls after which the device has received one more batch
		doneAt      int   // the poll that returns a completion (0: none)
		stopAt      int   // the poll after which stop reports the wait over (0: never)
		polls       int   // polls made
		n           int   // completions returned
		quiet       int   // us after start the device was last heard
	}{
		{name: "silent device: the budget", budget: 10 * us, top: 40 * us, polls: 10},
		{name: "silent, budget at its top", budget: 40 * us, top: 40 * us, polls: 40},
		{name: "one batch: MaxSpin after it", budget: 10 * us, top: 40 * us, rxAt: []int{5}, polls: 45, quiet: 5},
		{name: "batches closer than MaxSpin keep it spinning", budget: 10 * us, top: 40 * us,
			rxAt: []int{5, 30, 60, 99, 138}, polls: 178, quiet: 138},
		{name: "a silence of MaxSpin ends it", budget: 10 * us, top: 40 * us,
			rxAt: []int{5, 45, 90}, polls: 85, quiet: 45},
		{name: "a batch after the budget ran out is too late", budget: 10 * us, top: 40 * us, rxAt: []int{11}, polls: 10},
		{name: "the completion ends it", budget: 10 * us, top: 40 * us, rxAt: []int{5, 30}, doneAt: 50, polls: 50, n: 3, quiet: 30},
		{name: "a completion within the budget", budget: 10 * us, top: 40 * us, doneAt: 7, polls: 7, n: 3},
		// A context that ends, or a CQ destroyed, while the device keeps
		// receiving for other QPs: the spin ends at the next empty poll.
		{name: "stop ends a busy spin", budget: 10 * us, top: 40 * us, rxAt: []int{5, 30, 60, 90}, stopAt: 70, polls: 70, quiet: 60},
		{name: "stop ends a silent spin", budget: 10 * us, top: 40 * us, stopAt: 3, polls: 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			polls, rx := 0, uint64(7) // batches received before the wait do not count
			clock := start
			poll := func() int {
				polls++
				clock = clock.Add(us)
				for _, p := range c.rxAt {
					if p == polls {
						rx++
					}
				}
				if polls == c.doneAt {
					return 3
				}
				require.Less(t, polls, 10000, "never stopped")
				return 0
			}
			stop := func() bool { return c.stopAt > 0 && polls >= c.stopAt }
			n, quiet := spinWhileBusy(poll, func() uint64 { return rx }, func() time.Time { return clock }, stop, start, c.budget, c.top)
			require.Equal(t, c.n, n)
			require.Equal(t, c.polls, polls)
			require.Equal(t, time.Duration(c.quiet)*us, quiet.Sub(start))
		})
	}
}
