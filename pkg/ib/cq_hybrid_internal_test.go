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
