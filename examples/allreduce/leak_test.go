package allreduce

import (
	"context"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// Rings that end every way a ring ends (Leave after allreduces, Close,
// a rank that closed under the others, a cancelled AllReduce) leave no
// goroutine behind once their members are closed, over RDMA and TCP.
func TestRingsLeaveNoGoroutines(t *testing.T) {
	leaks := testenv.SnapshotGoroutines(testenv.StackPackages("github.com/rxed/rxed/examples/allreduce")...)
	ctx := context.Background()
	for _, tr := range []string{"rdma", "tcp"} {
		dial := func(n int) func(context.Context, int) (Member, error) {
			if tr == "tcp" {
				return tcpDialer(freePortBase(t, n), same(n, n), same(n, 999), 20*time.Second)
			}
			return rdmaDialer(t, transport.NewMemNetwork(), same(n, n), same(n, 999), 20*time.Second)
		}
		// Left after two allreduces.
		ms, err := Join(ctx, 3, dial(3))
		require.NoError(t, err)
		requireAllReduce(t, ctx, ms)
		requireAllReduce(t, ctx, ms)
		errs := make(chan error, 3)
		for _, m := range ms {
			go func() {
				if r, ok := m.(*RDMARank); ok {
					errs <- r.Leave(ctx)
					return
				}
				errs <- m.(*Ring).Leave(ctx)
			}()
		}
		for range 3 {
			require.NoError(t, <-errs)
		}
		closeAll(ms)

		// A rank closed under the others, a cancelled AllReduce.
		ms, err = Join(ctx, 3, dial(3))
		require.NoError(t, err)
		ms[2].Close()
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		require.Error(t, ms[0].AllReduce(cctx))
		require.Error(t, ms[1].AllReduce(ctx))
		closeAll(ms[:2])
	}
	leaks.CheckNoneLeft(t)
}
