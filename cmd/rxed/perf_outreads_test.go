package main

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/oob"
	"github.com/stretchr/testify/require"
)

// -o is perftest's --outs: read and atomic tests only, 1..128, default 128.
func TestPerfOutReadsFlag(t *testing.T) {
	a, _ := addrPair(t)
	for _, c := range []struct {
		args []string
		want int
		err  string
	}{
		{[]string{"read"}, 128, ""},
		{[]string{"atomic"}, 128, ""},
		{[]string{"write"}, 1, ""},
		{[]string{"send", "--lat"}, 1, ""},
		{[]string{"read", "-o", "8"}, 8, ""},
		{[]string{"atomic", "-o", "1"}, 1, ""},
		{[]string{"read", "--lat", "-o", "128"}, 128, ""},
		{[]string{"read", "-o", "129"}, 0, "-o 129"},
		{[]string{"atomic", "-o", "-1"}, 0, "-o -1"},
		{[]string{"write", "-o", "4"}, 0, "read and atomic"},
		{[]string{"send", "-o", "4"}, 0, "read and atomic"},
	} {
		errOut := newSyncBuffer()
		o, code, ok := parsePerf(append(c.args, "--addr", a), errOut)
		if c.err != "" {
			require.False(t, ok, c.args)
			require.Equal(t, 2, code, c.args)
			require.Contains(t, errOut.String(), c.err, c.args)
			continue
		}
		require.True(t, ok, "%v: %s", c.args, errOut.String())
		require.Equal(t, c.want, o.outReads, c.args)
	}
}

// An rxed read server started with -o 3 announces 3 in its key message
// (the peer's max_rd_atomic) and its banner, as perftest does.
func TestPerfOutReadsInKey(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port := reservePort(t)
	sout, _, sdone := startCmd("perf", "read", "-o", "3", "--addr", a, "-p", port, "-s", "4096", "-n", "10",
		"--timeout", "5s", "--wait", "20s")
	sout.waitFor(t, "Waiting for client", 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sess, err := oob.DialPerftest(ctx, "127.0.0.1:"+port, &oob.SessionConfig{})
	require.NoError(t, err)
	_, err = sess.Negotiate(ctx, 3)
	require.NoError(t, err)
	gid := netip.MustParseAddr(b)
	local := oob.Key{OutReads: 5, QPN: 0x42, PSN: 0x1234, RKey: 0x77, VAddr: 0x10000, GID: gid.As16()}
	remote, err := sess.HandShake(ctx, local)
	require.NoError(t, err)
	require.EqualValues(t, 3, remote.OutReads)
	_ = sess.CloseWithoutExchange()
	srv := await(t, sdone, 30*time.Second)
	require.Contains(t, srv.stdout, "Outstand reads  : 3")
}

// Read and atomic runs between two rxed ends at depth 1 and 2: the
// requester must keep to the responder's announced depth.
func TestPerfOutReadsRun(t *testing.T) {
	t.Parallel()
	for _, c := range [][]string{
		{"read", "-s", "8192", "-n", "100", "-o", "1"},
		{"read", "-s", "4096", "-n", "100", "-o", "2"},
		{"atomic", "-A", "CMP_AND_SWAP", "-n", "100", "-o", "1"},
		{"atomic", "-n", "100", "-o", "2", "-q", "2"},
	} {
		t.Run(c[0]+"_o"+c[len(c)-1], func(t *testing.T) {
			t.Parallel()
			a, b := addrPair(t)
			port := reservePort(t)
			common := append([]string{"-p", port, "--validate", "--timeout", "20s", "--progress", "0"}, c[1:]...)
			srv, cli := runPair(t,
				append([]string{"perf", c[0], "--addr", a}, common...), "Waiting for client",
				append(append([]string{"perf", c[0], "--addr", b}, common...), "127.0.0.1"))
			requireOK(t, "server", srv)
			requireOK(t, "client", cli)
			for _, out := range []string{srv.stdout, cli.stdout} {
				require.Contains(t, out, "Outstand reads  : "+c[len(c)-1])
				if c[0] == "read" { // perftest prints OUT for read tests only
					require.Contains(t, out, " OUT 0x0"+c[len(c)-1])
				}
			}
		})
	}
}
