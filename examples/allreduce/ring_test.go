package allreduce

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

const cmPort = 7600

// rdmaBase is rank 0's address in the tests' address plan (rank i's is
// the i-th after it).
var rdmaBase = netip.MustParseAddr("10.0.1.1")

// memDev opens rank's device on n; wrap, if not nil, stands between the
// engine and the network.
func memDev(t *testing.T, n *transport.MemNetwork, rank int, wrap func(int, transport.Conn) transport.Conn) *ib.Device {
	t.Helper()
	a := CMAddr(rdmaBase, rank, transport.RoCEv2Port)
	c, err := n.Listen(a)
	require.NoError(t, err)
	if wrap != nil {
		c = wrap(rank, c)
	}
	dev, err := ib.OpenDevice(ib.Config{Conn: c, Workers: 1})
	require.NoError(t, err)
	return dev
}

// rdmaDialer dials rank i over RDMA on its own device; counts[i] and
// ranks[i] let a test give one rank a different view.
func rdmaDialer(t *testing.T, net *transport.MemNetwork, ranks, counts []int, timeout time.Duration) func(context.Context, int) (Member, error) {
	return rdmaDialerOver(t, net, nil, ranks, counts, timeout)
}

// rdmaDialerOver is rdmaDialer with each rank's network wrapped (memDev).
func rdmaDialerOver(t *testing.T, net *transport.MemNetwork, wrap func(int, transport.Conn) transport.Conn, ranks, counts []int, timeout time.Duration) func(context.Context, int) (Member, error) {
	return rdmaDialerWith(t, net, wrap, len(ranks), func(i int) Config {
		return Config{Rank: i, Ranks: ranks[i], Count: counts[i], Timeout: timeout}
	})
}

// rdmaDialerWith dials rank i of n with cfgOf(i), each rank on its own
// device (wrap as in memDev).
func rdmaDialerWith(t *testing.T, net *transport.MemNetwork, wrap func(int, transport.Conn) transport.Conn, n int, cfgOf func(i int) Config) func(context.Context, int) (Member, error) {
	base := rdmaBase
	devs := make([]*ib.Device, n)
	for i := range devs { // every engine up before anyone dials
		devs[i] = memDev(t, net, i, wrap)
		require.NoError(t, rdmacm.Enable(devs[i], nil))
	}
	return func(ctx context.Context, i int) (Member, error) {
		dev := devs[i]
		r, err := DialRDMA(ctx, dev, cfgOf(i), RDMAConfig{Listen: CMAddr(base, i, cmPort), Next: CMAddr(base, (i+1)%n, cmPort)})
		if err != nil {
			dev.Close()
			return nil, err
		}
		return &RDMARank{Ring: r, Dev: dev}, nil
	}
}

func tcpDialer(ports int, ranks, counts []int, timeout time.Duration) func(context.Context, int) (Member, error) {
	addr := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", ports+i) }
	return func(ctx context.Context, i int) (Member, error) {
		cfg := Config{Rank: i, Ranks: ranks[i], Count: counts[i], Timeout: timeout}
		r, err := DialTCP(ctx, cfg, TCPConfig{Listen: addr(i), Next: addr((i + 1) % len(ranks))})
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}

func same(n, v int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = v
	}
	return s
}

func closeAll(ms []Member) {
	for _, m := range ms {
		m.Close()
	}
}

func TestAllReduceBitExact(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int{2, 3, 4} {
		for _, count := range []int{n, 1000, 4099} { // one element per rank, uneven chunks
			t.Run(fmt.Sprintf("rdma/n=%d/count=%d", n, count), func(t *testing.T) {
				ms, err := Join(ctx, n, rdmaDialer(t, transport.NewMemNetwork(), same(n, n), same(n, count), 10*time.Second))
				require.NoError(t, err)
				defer closeAll(ms)
				for range 2 { // the ring is reusable: steps go on counting
					requireAllReduce(t, ctx, ms)
				}
			})
			t.Run(fmt.Sprintf("tcp/n=%d/count=%d", n, count), func(t *testing.T) {
				ms, err := Join(ctx, n, tcpDialer(freePortBase(t, n), same(n, n), same(n, count), 10*time.Second))
				require.NoError(t, err)
				defer closeAll(ms)
				requireAllReduce(t, ctx, ms)
			})
		}
	}
}

// requireAllReduce runs one allreduce on every member (Run) and requires
// every rank to succeed and every sum to be bit-exact (Check).
func requireAllReduce(t *testing.T, ctx context.Context, ms []Member) {
	t.Helper()
	_, errs := Run(ctx, ms)
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Zero(t, Check(ms))
}

// The check is meaningful: summing in another order changes some bits.
func TestReferenceOrderMatters(t *testing.T) {
	inputs := [][]float32{Input(0, 1000), Input(1, 1000), Input(2, 1000), Input(3, 1000)}
	ref := Reference(inputs)
	naive := make([]float32, 1000)
	for i := range naive {
		naive[i] = ((inputs[0][i] + inputs[1][i]) + inputs[2][i]) + inputs[3][i]
	}
	require.NotZero(t, Mismatches(naive, ref))
	ref[7] = math.Nextafter32(ref[7], 1e9)
	require.Equal(t, 1, Mismatches(ref, Reference(inputs)))
}

// Mismatched sizes or rank counts: every rank fails, saying why, within
// the timeout.
func TestMismatchRefused(t *testing.T) {
	ctx := context.Background()
	cases := map[string]struct {
		ranks, counts []int
		want          string
	}{
		"size":  {[]int{3, 3, 3}, []int{1024, 2048, 1024}, "size mismatch"},
		"ranks": {[]int{2, 3}, []int{1024, 1024}, "rank count mismatch"},
	}
	for name, c := range cases {
		for _, tr := range []string{"rdma", "tcp"} {
			t.Run(name+"/"+tr, func(t *testing.T) {
				dial := rdmaDialer(t, transport.NewMemNetwork(), c.ranks, c.counts, 1500*time.Millisecond)
				if tr == "tcp" {
					dial = tcpDialer(freePortBase(t, len(c.ranks)), c.ranks, c.counts, 1500*time.Millisecond)
				}
				errs := make([]error, len(c.ranks))
				done := make(chan int)
				for i := range c.ranks {
					go func() {
						m, err := dial(ctx, i)
						if m != nil {
							defer m.Close()
						}
						errs[i] = err
						done <- i
					}()
				}
				for range c.ranks {
					select {
					case <-done:
					case <-time.After(20 * time.Second):
						t.Fatal("a rank hangs")
					}
				}
				mentioned := 0
				for i, err := range errs {
					require.Error(t, err, "rank %d", i)
					if strings.Contains(err.Error(), c.want) {
						mentioned++
					}
				}
				require.GreaterOrEqual(t, mentioned, 2, "both neighbours of the mismatch name it: %v", errs)
			})
		}
	}
}

// A rank that dies mid-ring: every other rank's allreduce fails, none
// hangs.
func TestRankDies(t *testing.T) {
	ctx := context.Background()
	for _, tr := range []string{"rdma", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			n := 3
			dial := rdmaDialer(t, transport.NewMemNetwork(), same(n, n), same(n, 3000), 3*time.Second)
			if tr == "tcp" {
				dial = tcpDialer(freePortBase(t, n), same(n, n), same(n, 3000), 3*time.Second)
			}
			ms, err := Join(ctx, n, dial)
			require.NoError(t, err)
			defer closeAll(ms[:2])
			ms[2].Close() // dies before the run
			errs := make(chan error, 2)
			for _, m := range ms[:2] {
				go func() { errs <- m.AllReduce(ctx) }()
			}
			for range 2 {
				select {
				case err := <-errs:
					require.Error(t, err)
					require.Contains(t, err.Error(), "allreduce: rank")
				case <-time.After(20 * time.Second):
					t.Fatal("a rank hangs after its neighbour died")
				}
			}
		})
	}
}

// TestConfigRefusesMoreRanksThanTheHelloCarries: a rank count or rank
// that does not fit the hello's 16-bit fields is refused before anything
// is connected. Bug (the workload audit, session AH): Config.check had
// no upper bound, and 65,537 ranks went out in the hello as 1.
func TestConfigRefusesMoreRanksThanTheHelloCarries(t *testing.T) {
	ok := Config{Ranks: MaxRanks, Rank: MaxRanks - 1, Count: MaxRanks, Timeout: time.Second}
	require.NoError(t, ok.check())
	for _, c := range []Config{
		{Ranks: MaxRanks + 1, Rank: 0, Count: MaxRanks + 1, Timeout: time.Second},
		{Ranks: 1 << 20, Rank: 5, Count: 1 << 20, Timeout: time.Second},
		{Ranks: 1, Rank: 0, Count: 4, Timeout: time.Second},
	} {
		require.ErrorContains(t, c.check(), "ranks (2 to 65535)", "%+v", c)
	}
}
