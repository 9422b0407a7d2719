package allreduce

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A connection to a TCP rank's port that is not its previous rank (a port
// scanner, a health check, an HTTP client at the wrong port) is refused
// and the rank goes on listening for its neighbour, as the RDMA ring
// passes over a REQ that is not a ring's. Bug (workload audit): the TCP
// rank took the first connection for its neighbour and failed the ring's
// setup on its garbage ("the peer is not an allreduce rank"); one that
// said nothing held the setup until Timeout.
func TestTCPRankRefusesAStrayConnection(t *testing.T) {
	for _, stray := range []string{"garbage", "silent"} {
		t.Run(stray, func(t *testing.T) {
			n := 3
			base := freePortBase(t, n)
			dial := tcpDialer(base, same(n, n), same(n, 999), 20*time.Second)
			ctx := context.Background()
			ms := make([]Member, n)
			errs := make(chan error, n)
			go func() {
				var err error
				ms[1], err = dial(ctx, 1)
				errs <- err
			}()
			// The stray is rank 1's first connection: rank 0 has not
			// started yet.
			var c net.Conn
			require.Eventually(t, func() bool {
				var err error
				c, err = net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", base+1))
				return err == nil
			}, 20*time.Second, time.Millisecond)
			defer c.Close()
			if stray == "garbage" {
				_, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: rank1\r\nUser-Agent: probe\r\n\r\n"))
				require.NoError(t, err)
			}
			for _, i := range []int{0, 2} {
				go func() {
					var err error
					ms[i], err = dial(ctx, i)
					errs <- err
				}()
			}
			for range n {
				require.NoError(t, <-errs)
			}
			defer closeAll(ms)
			requireAllReduce(t, ctx, ms)
		})
	}
}
