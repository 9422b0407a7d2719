package main

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFlagsAfterTheServerAddress: perf, perf tcp and pingpong take their
// flags before and after the server address, as perftest's and the
// pingpong tools' getopt does (ib_write_bw 10.0.0.1 -s 65536); "--" ends
// the flags; two addresses are still refused. Bug (found by the tools
// audit, session AF): flags after the address were taken for a second
// address ("more than one server address").
func TestFlagsAfterTheServerAddress(t *testing.T) {
	p, code, ok := parsePerf([]string{"write", "--addr", "127.0.0.3", "127.0.0.2", "-n", "7", "-s", "4096"}, io.Discard)
	require.True(t, ok, code)
	require.Equal(t, "127.0.0.2", p.server)
	require.Equal(t, uint64(7), p.iters)
	require.Equal(t, uint64(4096), p.size)

	p, _, ok = parsePerf([]string{"write", "--addr", "127.0.0.3", "-n", "9", "--", "127.0.0.2"}, io.Discard)
	require.True(t, ok)
	require.Equal(t, "127.0.0.2", p.server)
	require.Equal(t, uint64(9), p.iters)

	pp, code, ok := parsePingpong([]string{"127.0.0.2", "-s", "64", "-n", "3", "--addr", "127.0.0.3"}, io.Discard)
	require.True(t, ok, code)
	require.Equal(t, "127.0.0.2", pp.server)
	require.Equal(t, uint(64), pp.size)
	require.Equal(t, uint(3), pp.iters)

	pt, code, ok := parsePerfTCP([]string{"127.0.0.2", "-n", "11"}, io.Discard)
	require.True(t, ok, code)
	require.Equal(t, "127.0.0.2", pt.server)
	require.Equal(t, uint64(11), pt.hello.iters)

	for _, args := range [][]string{
		{"perf", "write", "127.0.0.1", "-n", "5", "127.0.0.2"},
		{"pingpong", "127.0.0.1", "-s", "64", "127.0.0.2"},
		{"perf", "tcp", "127.0.0.1", "--", "127.0.0.2"},
	} {
		r := runCmd(args...)
		require.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
		requireOneLineError(t, r, "more than one server address")
	}
	r := runCmd("perf", "write", "127.0.0.1", "-n", "nine")
	require.Equal(t, 2, r.code)
	requireOneLineError(t, r, `"nine"`)
}
