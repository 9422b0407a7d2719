package allreduce

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/roce/transport"
)

// A second AllReduce on a ring whose AllReduce failed (a misuse: the ring
// is done) returns at once the ring's first failure, sticky: it is
// ErrRingFailed, wraps the first error (the rank that left, or the
// cancellation) and names no other rank. Bug (workload audit): the failed
// call's own hang-up (its DREQs, or over TCP its closed streams) was
// taken for a neighbour leaving, so the second call said "rank 1 left the
// ring" (the watcher of whichever connection ended first) or, over TCP,
// "sending to rank 1: use of closed network connection", of a ring whose
// rank 1 was alive and had done nothing, and whose failure was rank 0's
// own cancelled context or rank 2's leaving.
func TestAllReduceAfterAFailureReturnsTheFirstFailure(t *testing.T) {
	const n, timeout = 3, time.Minute
	for _, tr := range []string{"rdma", "tcp"} {
		dialer := func(t *testing.T) func(context.Context, int) (Member, error) {
			if tr == "tcp" {
				return tcpDialer(freePortBase(t, n), same(n, n), same(n, 3000), timeout)
			}
			return rdmaDialer(t, transport.NewMemNetwork(), same(n, n), same(n, 3000), timeout)
		}
		for _, why := range []string{"cancelled", "rank 2 left"} {
			t.Run(tr+"/"+why, func(t *testing.T) {
				ms, err := Join(context.Background(), n, dialer(t))
				require.NoError(t, err)
				defer closeAll(ms)
				ctx := context.Background()
				if why == "cancelled" {
					cctx, cancel := context.WithCancel(ctx)
					cancel()
					ctx = cctx
				} else {
					require.NoError(t, ms[2].Close())
				}
				first := ms[0].AllReduce(ctx)
				require.Error(t, first)
				t.Log("first: ", first)
				if why == "cancelled" {
					require.ErrorIs(t, first, context.Canceled)
				} else {
					require.ErrorContains(t, first, "rank 2")
				}
				require.NotContains(t, first.Error(), "rank 1", "rank 1 did nothing")
				for range 2 {
					again := ms[0].AllReduce(context.Background())
					t.Log("again: ", again)
					require.ErrorIs(t, again, ErrRingFailed)
					require.ErrorIs(t, again, first, "the sticky error wraps the first")
					require.ErrorContains(t, again, "the ring already failed in an earlier AllReduce: "+first.Error())
					require.NotContains(t, again.Error(), "rank 1", "rank 1 did nothing")
				}
			})
		}
	}
}
