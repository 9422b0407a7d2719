package allreduce

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// faultyLinks wraps every rank's network in a seeded Faulty: what each
// rank sends is lost, duplicated, reordered and corrupted (the engine's
// ICRC drops the corrupted copies), the seed different per rank.
func faultyLinks(spec string, seed int64) func(int, transport.Conn) transport.Conn {
	return func(rank int, c transport.Conn) transport.Conn {
		cfg, err := transport.ParseFaultSpec(spec)
		if err != nil {
			panic(err)
		}
		cfg.Seed = seed*31 + int64(rank)
		return transport.NewFaulty(c, cfg)
	}
}

// Lossy, reordering links (the --fault syntax, several seeds): the RC
// recovery under the ring must leave every rank's sum bit-exact against
// Reference, allreduce after allreduce, with uneven chunks of several
// packets each.
func TestAllReduceBitExactThroughFaults(t *testing.T) {
	ctx := context.Background()
	const spec = "loss=0.03,dup=0.02,reorder=0.05,corrupt=0.01,dir=send"
	for _, seed := range []int64{1, 2, 3} {
		for _, n := range []int{3, 4} {
			t.Run(fmt.Sprintf("seed=%d/n=%d", seed, n), func(t *testing.T) {
				count := 1000*n + 7 // chunks of ~1000 floats: 4 packets at MTU 1024
				ms, err := Join(ctx, n, rdmaDialerOver(t, transport.NewMemNetwork(), faultyLinks(spec, seed), same(n, n), same(n, count), 30*time.Second))
				require.NoError(t, err)
				defer closeAll(ms)
				for range 3 {
					requireAllReduce(t, ctx, ms)
				}
			})
		}
	}
}
