package allreduce

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// CheckRank (streamed, O(ranks) memory) agrees with Reference, and counts
// a one-ulp difference.
func TestCheckRankMatchesReference(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		for _, count := range []int{n, 1001} {
			inputs := make([][]float32, n)
			for r := range inputs {
				inputs[r] = Input(r, count)
			}
			ref := Reference(inputs)
			require.Zero(t, CheckRank(ref, n), "n=%d count=%d", n, count)
			ref[count-1] = math.Nextafter32(ref[count-1], 1e9)
			require.Equal(t, 1, CheckRank(ref, n))
			require.Equal(t, count, CheckRank(Input(0, count), n), "an unreduced vector differs everywhere")
		}
	}
}

// Ranks that run on their own, as separate processes do: nobody waits
// for the others between allreduces, and each leaves (and, over RDMA,
// disconnects) as soon as its own MeasureRank returns, while a neighbour
// may still be in its last step. Leave makes that safe: every rank
// finishes, bit-exact; several rings in a row reuse the listeners' ports.
func TestRanksOnTheirOwn(t *testing.T) {
	ctx := context.Background()
	for _, tr := range []string{"rdma", "tcp"} {
		for _, n := range []int{2, 4} {
			t.Run(fmt.Sprintf("%s/n=%d", tr, n), func(t *testing.T) {
				net := transport.NewMemNetwork()
				base := netip.MustParseAddr("10.0.1.1") // memDev's plan
				devs := make([]*ib.Device, n)
				for i := range devs {
					devs[i] = memDev(t, net, i, nil)
					require.NoError(t, rdmacm.Enable(devs[i], nil))
					defer devs[i].Close()
				}
				tcpBase := freePortBase(t, n)
				errs := make(chan error, n)
				for i := range n {
					go func() {
						errs <- func() error {
							for _, count := range []int{n, 1000, 4099} {
								cfg := Config{Rank: i, Ranks: n, Count: count, Timeout: 20 * time.Second}
								var r *Ring
								var err error
								if tr == "rdma" {
									r, err = DialRDMA(ctx, devs[i], cfg, RDMAConfig{Listen: CMAddr(base, i, cmPort), Next: CMAddr(base, (i+1)%n, cmPort)})
								} else {
									r, err = DialTCP(ctx, cfg, TCPConfig{Listen: fmt.Sprintf("127.0.0.1:%d", tcpBase+i), Next: fmt.Sprintf("127.0.0.1:%d", tcpBase+(i+1)%n)})
								}
								if err != nil {
									return err
								}
								res := MeasureRank(ctx, r, i, n, 3, nil)
								if err := r.Leave(ctx); err != nil {
									return err
								}
								if res.Failed != nil {
									return res.Failed
								}
								if res.Wrong != 0 {
									return fmt.Errorf("rank %d, %d elements: %d wrong", i, count, res.Wrong)
								}
								if res.Time <= 0 || res.BusBW <= 0 {
									return fmt.Errorf("rank %d: no time measured: %+v", i, res)
								}
							}
							return nil
						}()
					}()
				}
				for range n {
					select {
					case err := <-errs:
						require.NoError(t, err)
					case <-time.After(2 * time.Minute):
						t.Fatal("a rank hangs")
					}
				}
			})
		}
	}
}
