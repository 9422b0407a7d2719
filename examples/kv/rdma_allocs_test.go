package kv

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// A PUT whose response comes in time allocates nothing in the client:
// its wait for the response checks the probe's deadline as it spins and
// arms the client's one timer only when it sleeps (probeDeadline), under
// a context that never ends or one with a deadline, spinning or sleeping
// at once. What a PUT allocates here is the in-memory network's copy of
// each of its four datagrams (the SEND, its ACK, the response, its ACK),
// 4 to 4.2 on average (the server's table allocates nothing:
// TestTableWriteAllocatesNothing), so the bound allows one more for the
// engines' background work. Bug (workload
// audit): context.WithTimeoutCause per PUT, 4 more allocations and about
// 0.4 us, for a probe that a response in time never needs.
func TestRDMAPutAllocatesNothingInTheClient(t *testing.T) {
	const network, server, slack = 4, 0, 1
	for _, spin := range []string{"spinning", "sleeping"} {
		for _, under := range []string{"Background", "deadline"} {
			t.Run(spin+"/"+under, func(t *testing.T) {
				r := newRig(t)
				cfg := &RDMAClientConfig{}
				if spin == "sleeping" {
					cfg.Spin = -1
				}
				c, err := DialRDMA(ctxT(t), r.cliDev, r.cmAddr, cfg)
				require.NoError(t, err)
				t.Cleanup(func() { _ = c.Close() })
				ctx := context.Background()
				if under == "deadline" {
					ctx = ctxT(t)
				}
				key, val := []byte("key"), []byte("a value")
				put := func() {
					if err := c.Put(ctx, key, val); err != nil {
						t.Fatal(err)
					}
				}
				for range 100 {
					put()
				}
				allocs := testing.AllocsPerRun(1000, put)
				t.Logf("%v allocations per PUT", allocs)
				require.LessOrEqual(t, allocs, float64(network+server+slack), "allocations per PUT beyond the network's and the server's")
				require.Zero(t, c.Stats().Probes, "every response came in time")
			})
		}
	}
}
