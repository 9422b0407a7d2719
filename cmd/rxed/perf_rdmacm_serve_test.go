package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestServeRDMACM: perftest -R clients (rxed perf -R speaks their
// exchange) against rxed serve --rdma-cm-port: write and read runs
// against the export, a READ over --max-read refused, a send test refused
// with a reason in the log, and the daemon serving on throughout.
func TestServeRDMACM(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	d, logs, _, _ := startServe(t, "--addr", a, "-p", "0", "--rdma-cm-port", "18515", "--export", "data=anon,size=1M",
		"--max-read", "16K", "--log-level", "debug", "--timeout", "5s")
	require.Equal(t, uint16(18515), d.RDMACMAddr().Port())
	client := func(args ...string) result {
		return runCmd(append(append([]string{"perf"}, args...), "-R", "--addr", b, "--progress", "0", "--timeout", "5s", a)...)
	}
	w := client("write", "-s", "65536", "-n", "50", "--validate")
	requireOK(t, "perf write -R", w)
	require.Regexp(t, bwRow(65536, 50), w.stdout)
	// An export is no rxed perf server; the note says it may be rxed
	// serve (newcomer walkthrough of docs/tools.md: it said "the peer is
	// not rxed" of rxed serve).
	require.Contains(t, w.stderr, "the peer is not rxed perf (perftest, or rxed serve over -R)")

	r := client("read", "-s", "4096", "-n", "50", "-q", "2")
	requireOK(t, "perf read -R", r)
	require.Regexp(t, bwRow(4096, 100), r.stdout)

	// Both are refused after they connected: the READ by its replies'
	// drop (the client runs out of retries), the send test by the key
	// the daemon will not answer.
	big := client("read", "-s", "65536", "-n", "5", "--qp-timeout", "8")
	require.NotEqual(t, 0, big.code, "a READ longer than --max-read:\n%s", big.stdout)
	require.Contains(t, big.stderr, "RETRY_EXC_ERR", "a READ longer than --max-read:\n%s", big.stdout)

	sd := client("send", "-n", "10")
	require.NotEqual(t, 0, sd.code)
	require.Contains(t, sd.stderr, "the peer disconnected", "a send test:\n%s", sd.stdout)
	logs.waitFor(t, "the client runs a send test", 10*time.Second)

	logs.waitForCount(t, "perftest rdma_cm session complete", 2, 10*time.Second)
	require.Regexp(t, `(?m)^rxed_read_cap_drops_total [1-9]`, d.Metrics())
}
