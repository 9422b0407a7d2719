package ib

import (
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/stretchr/testify/require"
)

// A spinner's yield is due once spinYieldEvery has passed since the last
// one, and only one of two pollers racing for it takes it (cq_spin.go:
// yielding before the runtime's signal preemption, session N).
func TestSpinYieldDue(t *testing.T) {
	every := int64(spinYieldEvery)
	var s spinYield
	s.yielded.Store(1000)
	for _, c := range []struct {
		now  int64
		want bool
	}{
		{1000, false},             // just yielded
		{1000 + every - 1, false}, // not yet
		{1000 + every, true},      // due: recorded
		{1000 + every + 1, false}, // the one just recorded counts
		{1000 + 3*every, true},    // long past: due
		{1000 + 3*every, false},   // a second poller at the same instant
		{1000 + 2*every, false},   // a clock reading from before the last yield
	} {
		require.Equal(t, c.want, s.due(c.now), "at %d (last %d)", c.now, s.yielded.Load())
	}
}

// Poll yields now and then although it always finds a completion (such
// a spinner never reaches the Gosched of an empty poll): the clock is
// read on one call in spinCheckEvery, and a yield due is recorded.
func TestPollYieldsWhileItFindsCompletions(t *testing.T) {
	cq, err := new(Device).CreateCQ(8)
	require.NoError(t, err)
	past := -int64(time.Hour)
	cq.spin.yielded.Store(past)
	var wc [1]WC
	for i := range spinCheckEvery {
		if i == spinCheckEvery-1 {
			require.Equal(t, past, cq.spin.yielded.Load(), "no clock reading before the %dth call", spinCheckEvery)
		}
		require.NoError(t, cq.c.Push(qp.WC{ID: uint64(i)}))
		require.Equal(t, 1, cq.Poll(wc[:]))
		require.EqualValues(t, i, wc[0].ID)
	}
	require.Greater(t, cq.spin.yielded.Load(), past, "the %dth Poll yielded: the last yield was an hour ago", spinCheckEvery)
}
