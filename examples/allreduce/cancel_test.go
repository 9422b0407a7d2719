package allreduce

import (
	"context"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// An AllReduce whose context is cancelled returns at once with the
// cancellation, whatever its neighbours do (here: nothing, their ranks
// never start), well before the step Timeout; over TCP as over RDMA. Bug
// (workload audit): the TCP ring's reads took only the context's
// deadline, so a cancelled rank waited for its previous rank's chunk
// until Timeout (a minute here) and then blamed it ("did it die?").
func TestAllReduceReturnsWhenCancelled(t *testing.T) {
	const timeout = time.Minute
	for _, tr := range []string{"rdma", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			n := 3
			dial := rdmaDialer(t, transport.NewMemNetwork(), same(n, n), same(n, 3000), timeout)
			if tr == "tcp" {
				dial = tcpDialer(freePortBase(t, n), same(n, n), same(n, 3000), timeout)
			}
			ms, err := Join(context.Background(), n, dial)
			require.NoError(t, err)
			defer closeAll(ms)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			done := make(chan error, 1)
			go func() { done <- ms[0].AllReduce(ctx) }()
			select {
			case err = <-done:
			case <-time.After(timeout / 2):
				t.Fatal("a cancelled AllReduce waits for its neighbours")
			}
			require.ErrorIs(t, err, context.Canceled)
			require.NotContains(t, err.Error(), "did it die")
		})
	}
}
