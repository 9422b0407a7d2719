package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// UD pingpong carries 4096-byte messages (ibv_ud_pingpong -s 4096 on a
// jumbo-frame rxe link): UD uses the port's active MTU, 4096 by default.
//
// Regression test: was TestRegressUDPingpong4096 in regress_udmtu_test.go
// (added in commit 77b8bdc).
func TestUDPingpong4096(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port := reservePort(t)
	common := []string{"-p", port, "-c", "--timeout", "10s", "-t", "ud", "-s", "4096", "-n", "20"}
	srv, cli := runPair(t,
		append([]string{"pingpong", "--addr", a}, common...), "local address",
		append(append([]string{"pingpong", "--addr", b}, common...), "127.0.0.1"))
	requireOK(t, "server", srv)
	requireOK(t, "client", cli)
	requirePingpongSummary(t, srv.stdout, 4096, 20)
	requirePingpongSummary(t, cli.stdout, 4096, 20)
}

// -m lowers the port MTU, and a UD size above it is refused up front.
//
// Regression test: was TestRegressUDPingpongLoweredMTU in regress_udmtu_test.go
// (added in commit 77b8bdc).
func TestUDPingpongLoweredMTU(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	o, code, ok := parsePingpong([]string{"-t", "ud", "-m", "1024", "-s", "1025"}, &stderr)
	require.False(t, ok)
	require.Equal(t, 2, code)
	require.Nil(t, o)
	require.Contains(t, stderr.String(), "larger than the port MTU 1024")
	stderr.Reset()
	o, _, ok = parsePingpong([]string{"--addr", "127.0.0.1", "-t", "ud", "-m", "1024", "-s", "1024"}, &stderr)
	require.True(t, ok, stderr.String())
	require.EqualValues(t, 3, o.ef.activeMTU)
}
