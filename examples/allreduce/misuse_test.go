package allreduce

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/roce/transport"
)

// ringOf is m's Ring, whichever transport.
func ringOf(m Member) *Ring {
	if r, ok := m.(*RDMARank); ok {
		return r.Ring
	}
	return m.(*Ring)
}

// leaveAll leaves every member's ring at once (Leave waits for the
// neighbours' byes) and requires each to succeed.
func leaveAll(t *testing.T, ms []Member) {
	t.Helper()
	errs := make(chan error, len(ms))
	for _, m := range ms {
		go func() { errs <- ringOf(m).Leave(context.Background()) }()
	}
	for range ms {
		require.NoError(t, <-errs)
	}
}

// within runs f and fails the test if it has not returned within d (a
// hang: the misuses below must return at once).
func within(t *testing.T, d time.Duration, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("%s had not returned after %v", what, d)
		return nil
	}
}

// A ring used after it ended returns a clear error at once, over RDMA
// and TCP, instead of running on what its end destroyed: AllReduce after
// Close or after Leave is ErrClosed, Leave after a failed AllReduce is
// the ring's sticky ErrRingFailed (and frees the ring), Leave after Close
// is ErrClosed, and a second Close (or a Close after Leave) is a no-op.
// Bug (workload review, task BF): Ring had no closed state, so AllReduce
// after Close or Leave posted to destroyed QPs and polled a destroyed CQ
// (over TCP: wrote to closed streams and blamed the next rank), and Leave
// after a failed AllReduce sent its byes on the connections the failure
// had hung up and waited for answers that never come.
func TestRingMisuseAfterItEnded(t *testing.T) {
	const n, timeout = 3, time.Minute
	// Each misuse must return at once; a wait for a neighbour's answer
	// (Leave's, bounded by timeout) counts as a hang.
	const bound = timeout / 3
	for _, tr := range []string{"rdma", "tcp"} {
		dial := func(t *testing.T) func(context.Context, int) (Member, error) {
			if tr == "tcp" {
				return tcpDialer(freePortBase(t, n), same(n, n), same(n, 999), timeout)
			}
			return rdmaDialer(t, transport.NewMemNetwork(), same(n, n), same(n, 999), timeout)
		}
		join := func(t *testing.T) []Member {
			ms, err := Join(context.Background(), n, dial(t))
			require.NoError(t, err)
			t.Cleanup(func() { closeAll(ms) })
			return ms
		}
		ctx := context.Background()
		t.Run(tr+"/AllReduce after Close", func(t *testing.T) {
			ms := join(t)
			requireAllReduce(t, ctx, ms)
			r := ringOf(ms[0])
			require.NoError(t, r.Close())
			err := within(t, bound, "AllReduce after Close", func() error { return r.AllReduce(ctx) })
			t.Log(err)
			require.ErrorIs(t, err, ErrClosed)
			require.ErrorContains(t, err, "allreduce: rank 0")
			err = within(t, bound, "Leave after Close", func() error { return r.Leave(ctx) })
			require.ErrorIs(t, err, ErrClosed)
		})
		t.Run(tr+"/AllReduce after Leave", func(t *testing.T) {
			ms := join(t)
			requireAllReduce(t, ctx, ms)
			leaveAll(t, ms)
			for i, m := range ms {
				err := within(t, bound, "AllReduce after Leave", func() error { return m.AllReduce(ctx) })
				require.ErrorIs(t, err, ErrClosed, "rank %d", i)
			}
		})
		t.Run(tr+"/Leave after a failed AllReduce", func(t *testing.T) {
			ms := join(t)
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			r := ringOf(ms[0])
			first := r.AllReduce(cctx)
			require.ErrorIs(t, first, context.Canceled)
			err := within(t, bound, "Leave after a failed AllReduce", func() error { return r.Leave(ctx) })
			t.Log(err)
			require.ErrorIs(t, err, ErrRingFailed)
			require.ErrorIs(t, err, first)
			require.NotContains(t, err.Error(), "rank 1", "rank 1 did nothing")
			// Leave freed the ring.
			require.ErrorIs(t, r.AllReduce(ctx), ErrClosed)
			require.NoError(t, r.Close())
		})
		t.Run(tr+"/Close twice", func(t *testing.T) {
			ms := join(t)
			requireAllReduce(t, ctx, ms)
			r := ringOf(ms[0])
			require.NoError(t, within(t, bound, "Close", r.Close))
			require.NoError(t, within(t, bound, "a second Close", r.Close))
			require.ErrorIs(t, r.AllReduce(ctx), ErrClosed)
		})
		t.Run(tr+"/Leave then Close", func(t *testing.T) {
			ms := join(t)
			requireAllReduce(t, ctx, ms)
			leaveAll(t, ms)
			for _, m := range ms {
				require.NoError(t, within(t, bound, "Close after Leave", ringOf(m).Close))
				err := within(t, bound, "Leave after Leave", func() error { return ringOf(m).Leave(ctx) })
				require.ErrorIs(t, err, ErrClosed)
			}
		})
	}
}
