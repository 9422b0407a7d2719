package allreduce

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/roce/transport"
)

// DialRDMA's watchers record (ring.done, doneE) only a neighbour that
// really left: rank 0's own hang-up, a failed AllReduce's or its Close's,
// ends both its connections too, and records nothing; rank 2's Close is
// recorded by rank 0 as "rank 2 left the ring". Bug (workload review,
// task BF): the watchers took the end of any connection for its
// neighbour leaving, so rank 0's own hang-up recorded "rank 1 left the
// ring" (or rank 2, whichever connection ended first) of a live rank.
func TestRingRecordsOnlyANeighbourThatLeft(t *testing.T) {
	const n, timeout = 3, time.Minute
	join := func(t *testing.T) ([]Member, *Ring, *rdmaLink) {
		ms, err := Join(context.Background(), n, rdmaDialer(t, transport.NewMemNetwork(), same(n, n), same(n, 999), timeout))
		require.NoError(t, err)
		t.Cleanup(func() { closeAll(ms) })
		r := ms[0].(*RDMARank).Ring
		return ms, r, r.l.(*rdmaLink)
	}
	// waitEnded waits for both of l's connections to end: their
	// watchers, woken by that, have taken their Done case.
	waitEnded := func(t *testing.T, l *rdmaLink) {
		for _, c := range []interface{ Done() <-chan struct{} }{l.cNext, l.cPrev} {
			select {
			case <-c.Done():
			case <-time.After(timeout / 2):
				t.Fatal("a connection rank 0 hung up has not ended (its neighbour's DREP)")
			}
		}
	}
	// noRecord requires that nothing was recorded; r is closed first (if
	// it is not), which joins its watchers.
	noRecord := func(t *testing.T, r *Ring) {
		require.NoError(t, r.Close())
		select {
		case <-r.done:
			t.Fatalf("rank 0's own hang-up recorded as a neighbour leaving: %v", r.doneE())
		default:
		}
		require.NoError(t, r.doneE())
	}
	t.Run("a failed AllReduce's hang-up", func(t *testing.T) {
		_, r, l := join(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		require.ErrorIs(t, r.AllReduce(ctx), context.Canceled)
		waitEnded(t, l)
		noRecord(t, r)
	})
	t.Run("Close", func(t *testing.T) {
		_, r, l := join(t)
		// Close waits for the DREPs (which end the connections and wake
		// the watchers) before it stops the watchers.
		l.drepWait = timeout
		require.NoError(t, r.Close())
		waitEnded(t, l)
		noRecord(t, r)
	})
	t.Run("a neighbour that left", func(t *testing.T) {
		ms, r, _ := join(t)
		require.NoError(t, ms[2].Close())
		select {
		case <-r.done:
		case <-time.After(timeout / 2):
			t.Fatal("rank 2's Close not recorded by rank 0")
		}
		require.ErrorContains(t, r.doneE(), "rank 2 left the ring")
	})
}
