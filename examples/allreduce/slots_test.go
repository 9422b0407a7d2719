package allreduce

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// A ring hands no slot back (slotsFor): a rank that is late finds up to
// ranks-1 chunks waiting, each in a slot of its own. Rank 0 starts only
// once its previous rank has written as far ahead as the ring lets it
// (ranks-1 WRITEs with immediate completed in rank 0's CQ, and no more),
// and every rank's sum is still bit-exact. With fewer slots than ranks
// (2, as when slots were handed back by SEND) the third chunk lands on
// the first: at 4 and 5 ranks the sums come out wrong (1000 and 4800
// wrong elements when slotsFor returned 2). At 12 ranks the previous
// rank posts 11 WRITEs in a row, more than its send queue holds
// (sendDepth): it waits for room, not fails.
func TestLateRankFindsEveryChunkInItsOwnSlot(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int{2, 3, 4, 5, 12} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			ms, err := Join(ctx, n, rdmaDialer(t, transport.NewMemNetwork(), same(n, n), same(n, 1000), 20*time.Second))
			require.NoError(t, err)
			defer closeAll(ms)
			for i, m := range ms {
				copy(m.Data(), Input(i, len(m.Data())))
			}
			errs := make(chan error, n)
			for _, m := range ms[1:] {
				go func() { errs <- m.AllReduce(ctx) }()
			}
			late := ms[0].(*RDMARank).Ring.l.(*rdmaLink)
			require.Eventually(t, func() bool { return late.cq.Len() >= n-1 }, 20*time.Second, time.Millisecond,
				"rank %d wrote fewer than %d chunks ahead", n-1, n-1)
			require.Equal(t, n-1, late.cq.Len(), "rank %d wrote more than ranks-1 chunks ahead", n-1)
			go func() { errs <- ms[0].AllReduce(ctx) }()
			for range n {
				require.NoError(t, <-errs)
			}
			require.Zero(t, Check(ms))
		})
	}
}

// Config.Spin reaches each rank's waiter (0 is ib.DefaultHybridSpin's,
// negative sleeps at once), and a ring sums bit-exact however it waits.
func TestRDMARanksWaitAsConfigured(t *testing.T) {
	ctx := context.Background()
	for _, spin := range []time.Duration{0, 80 * time.Microsecond, -1} {
		t.Run(spin.String(), func(t *testing.T) {
			n := 3
			ms, err := Join(ctx, n, rdmaDialerWith(t, transport.NewMemNetwork(), nil, n, func(i int) Config {
				return Config{Rank: i, Ranks: n, Count: 1000, Timeout: 20 * time.Second, Spin: spin}
			}))
			require.NoError(t, err)
			defer closeAll(ms)
			for _, m := range ms {
				require.Equal(t, spin, m.(*RDMARank).Ring.l.(*rdmaLink).waiter.Spin)
			}
			for range 3 {
				requireAllReduce(t, ctx, ms)
			}
		})
	}
}

// A rank signals only the WRITEs it waits for (rdmaLink.send): the last
// of each phase, and one in every sendDepth/2 of a longer phase, so its
// CQ holds 2 WRITE completions per allreduce up to 5 ranks (phases of at
// most 4 steps) and 6 with 12 ranks (phases of 11: the 4th, 8th and
// 11th), where it held one per step; every sum stays bit-exact.
func TestOnlyTheWritesARankWaitsForSignal(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct{ n, perAllreduce int }{{2, 2}, {3, 2}, {5, 2}, {12, 6}} {
		t.Run(fmt.Sprintf("n=%d", c.n), func(t *testing.T) {
			ms, err := Join(ctx, c.n, rdmaDialer(t, transport.NewMemNetwork(), same(c.n, c.n), same(c.n, 1000), 20*time.Second))
			require.NoError(t, err)
			defer closeAll(ms)
			for range 3 {
				requireAllReduce(t, ctx, ms)
			}
			for i, m := range ms {
				l := m.(*RDMARank).Ring.l.(*rdmaLink)
				require.Equal(t, 3*c.perAllreduce, l.writeWCs, "rank %d's WRITE completions", i)
				require.Zero(t, l.inFlight, "rank %d", i)
				require.Zero(t, l.unsignaled, "rank %d", i)
			}
		})
	}
}
