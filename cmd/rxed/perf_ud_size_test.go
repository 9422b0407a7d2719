package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPerfUDDefaultSizeIsTheMTU: a UD send test without -s runs at the
// negotiated MTU, as perftest's does (check_link: "Max msg size in UD is
// MTU N" / "Changing to this MTU" when no size was asked for), rather than
// failing on the bandwidth default of 65536. An explicit -s larger than
// the MTU is still refused.
//
// Bug (found by the tools audit, session AF): `rxed perf send -c UD`
// without -s exited 1 on both sides with "-s 65536: UD messages must fit
// the MTU", although the user gave no -s and ib_send_bw -c UD runs at the
// MTU.
func TestPerfUDDefaultSizeIsTheMTU(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port := reservePort(t)
	common := []string{"-c", "UD", "-n", "50", "-p", port, "--validate", "--timeout", "20s", "--progress", "0"}
	// The client offers 1024: the negotiated MTU, and so the size of both
	// sides, is 1024 although the server's port has 4096.
	srv, cli := runPair(t,
		append([]string{"perf", "send", "--addr", a}, common...), "Waiting for client",
		append(append([]string{"perf", "send", "--addr", b, "-m", "1024"}, common...), "127.0.0.1"))
	requireOK(t, "server", srv)
	requireOK(t, "client", cli)
	for _, r := range []result{srv, cli} {
		require.Regexp(t, bwRow(1024, 50), r.stdout)
		require.Contains(t, r.stdout, " Mtu             : 1024[B]")
		require.Contains(t, r.stderr, " Max msg size in UD is MTU 1024\n Changing to this MTU\n")
	}

	// An explicit size above the negotiated MTU stays an error.
	port = reservePort(t)
	common[5] = port
	srv, cli = runPair(t,
		append([]string{"perf", "send", "--addr", a, "-s", "2048"}, common...), "Waiting for client",
		append(append([]string{"perf", "send", "--addr", b, "-s", "2048", "-m", "1024"}, common...), "127.0.0.1"))
	requireOneLineError(t, srv, "-s 2048", "MTU 1024")
	requireOneLineError(t, cli, "-s 2048", "MTU 1024")
}
