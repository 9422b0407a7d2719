package allreduce

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stuckLink is a link whose next rank takes nothing: send (stuckSend) or
// waitSent waits for the step's deadline; the previous rank's chunks are
// always there.
type stuckLink struct {
	stuckSend bool
	buf       []byte
}

func (l *stuckLink) send(ctx context.Context, _ uint32, _ []byte, _ bool) error {
	if l.stuckSend {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (l *stuckLink) recv(_ context.Context, _ uint32, n int) ([]byte, error) {
	return l.buf[:n], nil
}

func (l *stuckLink) waitSent(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

func (l *stuckLink) leave(context.Context) error { return nil }
func (l *stuckLink) hangUp()                     {}
func (l *stuckLink) close() error                { return nil }

// A step that times out waiting on the next rank (for room to send, or
// for its sends to complete) names the next rank, not the previous one,
// whose chunks all came. Bug (workload audit): stepErr turned every step
// deadline into "no data from rank PREV within T (did it die?)".
func TestStepTimeoutNamesTheNeighbourItWaitedFor(t *testing.T) {
	for _, stuckSend := range []bool{false, true} {
		name := map[bool]string{false: "waitSent", true: "send"}[stuckSend]
		t.Run(name, func(t *testing.T) {
			cfg := Config{Rank: 1, Ranks: 3, Count: 30, Timeout: 10 * time.Millisecond}
			r := &ring{cfg: cfg, l: &stuckLink{stuckSend: stuckSend, buf: make([]byte, 4*maxChunk(30, 3))},
				data: make([]float32, cfg.Count), done: make(chan struct{}), doneE: func() error { return nil }}
			err := r.allReduce(context.Background())
			t.Log(err)
			require.ErrorContains(t, err, "rank 2 did not take this rank's data within 10ms")
			require.NotContains(t, err.Error(), "rank 0")
		})
	}
}
