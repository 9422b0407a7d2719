package main

import (
	"fmt"
	"testing"
)

// `rxed pingpong -s 3000 -m 1024 --fault loss=0.05` on both sides used to
// fail for about one seed in six with RETRY_EXC_ERR: the side that
// finished first left while the peer still waited for the ACK of its
// last message (lost), so every retransmission went unanswered. The
// finished side now lingers until its peer has been quiet for two
// retransmit timeouts. Seeds failed that way before; --qp-timeout 12 (16 ms) keeps retries quick.
//
// Regression test: was TestRegressPingpongLossLastAck in regress_pplinger_test.go
// (added in commit ddcf82f).
func TestPingpongLossLastAck(t *testing.T) {
	t.Parallel()
	for _, seed := range []int{46, 59, 66, 69} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			a, b := addrPair(t)
			port := reservePort(t)
			common := []string{"-p", port, "-c", "--timeout", "20s", "-t", "rc", "-s", "3000", "-m", "1024",
				"-n", "60", "--qp-timeout", "12"}
			srv, cli := runPair(t,
				append(append([]string{"pingpong", "--addr", a}, common...), "--fault", fmt.Sprintf("loss=0.05,seed=%d", seed)),
				"local address",
				append(append([]string{"pingpong", "--addr", b}, common...), "--fault", fmt.Sprintf("loss=0.05,seed=%d", seed+1000), "127.0.0.1"))
			requireOK(t, "server", srv)
			requireOK(t, "client", cli)
			requirePingpongSummary(t, srv.stdout, 3000, 60)
			requirePingpongSummary(t, cli.stdout, 3000, 60)
		})
	}
}
