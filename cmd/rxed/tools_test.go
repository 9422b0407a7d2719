package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// pingpongSummary matches the tools' two result lines for size and iters.
func requirePingpongSummary(t *testing.T, out string, size, iters int) {
	t.Helper()
	re := regexp.MustCompile(fmt.Sprintf(`(?m)^%d bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec\n%d iters in [0-9.]+ seconds = [0-9.]+ usec/iter$`, size*iters*2, iters))
	require.Regexpf(t, re, out, "no pingpong summary for %d x %d bytes in:\n%s", iters, size, out)
	require.Contains(t, out, "  local address:  LID 0x0000, QPN 0x")
	require.Contains(t, out, "  remote address: LID 0x0000, QPN 0x")
}

func TestPingpong(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		args  []string
		size  int
		iters int
	}{
		{"rc", []string{"-t", "rc", "-s", "4096", "-n", "50"}, 4096, 50},
		{"rc_multipage", []string{"-t", "rc", "-s", "10000", "-n", "20", "-m", "1024"}, 10000, 20},
		{"uc", []string{"-t", "uc", "-s", "2048", "-n", "30", "-r", "64"}, 2048, 30},
		{"ud", []string{"-t", "ud", "-s", "1000", "-n", "30", "-m", "1024"}, 1000, 30},
		// Single-packet messages under loss and duplication; multi-packet
		// SENDs under loss are TestPingpongLossLastAck's, and perf's
		// fault cases cover multi-packet messages too.
		{"rc_faults", []string{"-t", "rc", "-s", "3000", "-m", "4096", "-n", "40",
			"--fault", "loss=0.03,dup=0.03,seed=11"}, 3000, 40},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b := addrPair(t)
			port := reservePort(t)
			counters := tempPath(t, "counters.json")
			common := append([]string{"-p", port, "-c", "--timeout", "10s"}, tc.args...)
			srv, cli := runPair(t,
				append([]string{"pingpong", "--addr", a}, common...), "local address",
				append(append([]string{"pingpong", "--addr", b, "--counters-out", counters}, common...), "127.0.0.1"))
			requireOK(t, "server", srv)
			requireOK(t, "client", cli)
			requirePingpongSummary(t, srv.stdout, tc.size, tc.iters)
			requirePingpongSummary(t, cli.stdout, tc.size, tc.iters)
			// Each side's remote line is the other's local line.
			require.Contains(t, cli.stdout, "GID ::ffff:"+a)
			require.Contains(t, srv.stdout, "GID ::ffff:"+b)
			c := readCounters(t, counters)
			require.Positive(t, c["sent_pkts"], "counters: %v", c)
			require.Positive(t, c["rcvd_pkts"], "counters: %v", c)
		})
	}
}

// bwRow matches a bandwidth result row for size and iterations.
func bwRow(size, iters int) *regexp.Regexp {
	return regexp.MustCompile(fmt.Sprintf(`(?m)^ %-7d    %-10d       +[0-9.]+ +[0-9.]+\s+[0-9.]+$`, size, iters))
}

func latRow(size, iters int) *regexp.Regexp {
	return regexp.MustCompile(fmt.Sprintf(`(?m)^ %-7d %d +([0-9.]+\s+){6}[0-9.]+\s*$`, size, iters))
}

func TestPerf(t *testing.T) {
	t.Parallel()
	type tc struct {
		name       string
		args       []string
		size, iter int // row expected
		lat        bool
		serverRow  bool // the server prints a result row too
	}
	faults := []string{"-t", "16", "--fault", "loss=0.03,dup=0.03,reorder=0.03,corrupt=0.01,seed=5"}
	cases := []tc{
		{"write_bw", []string{"write", "-s", "65536", "-n", "200"}, 65536, 200, false, true},
		{"write_bw_q3", []string{"write", "-s", "4096", "-n", "100", "-q", "3"}, 4096, 300, false, true},
		{"write_bw_uc", []string{"write", "-c", "UC", "-s", "8192", "-n", "50", "-t", "8"}, 8192, 50, false, true},
		{"read_bw", []string{"read", "-s", "16384", "-n", "200"}, 16384, 200, false, true},
		{"send_bw", []string{"send", "-s", "4096", "-n", "300"}, 4096, 300, false, true},
		{"send_bw_ud", []string{"send", "-c", "UD", "-s", "1024", "-n", "100", "-m", "1024"}, 1024, 100, false, true},
		{"send_bw_uc", []string{"send", "-c", "UC", "-s", "4096", "-n", "100"}, 4096, 100, false, true},
		{"atomic_faa", []string{"atomic", "-n", "300", "-q", "2"}, 8, 600, false, true},
		{"atomic_cas", []string{"atomic", "-A", "CMP_AND_SWAP", "-n", "300"}, 8, 300, false, true},
		{"write_lat", []string{"write", "--lat", "-s", "64", "-n", "100"}, 64, 100, true, true},
		{"send_lat", []string{"send", "--lat", "-s", "512", "-n", "100"}, 512, 100, true, true},
		{"read_lat", []string{"read", "--lat", "-s", "256", "-n", "100"}, 256, 100, true, false},
		{"atomic_lat", []string{"atomic", "--lat", "-n", "100"}, 8, 100, true, false},
		{"write_bw_faults", append([]string{"write", "-s", "8192", "-n", "200"}, faults...), 8192, 200, false, true},
		{"read_bw_faults", append([]string{"read", "-s", "8192", "-n", "200"}, faults...), 8192, 200, false, true},
		{"send_bw_faults", append([]string{"send", "-s", "2048", "-n", "200"}, faults...), 2048, 200, false, true},
		{"atomic_faults", append([]string{"atomic", "-n", "200"}, faults...), 8, 200, false, true},
		{"send_lat_faults", append([]string{"send", "--lat", "-s", "100", "-n", "50"}, faults...), 100, 50, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			a, b := addrPair(t)
			port := reservePort(t)
			counters := tempPath(t, "counters.json")
			common := append([]string{"-p", port, "--validate", "--timeout", "20s", "--progress", "0"}, c.args[1:]...)
			srv, cli := runPair(t,
				append([]string{"perf", c.args[0], "--addr", a}, common...), "Waiting for client",
				append(append([]string{"perf", c.args[0], "--addr", b, "--counters-out", counters}, common...), "127.0.0.1"))
			requireOK(t, "server", srv)
			requireOK(t, "client", cli)
			row := bwRow(c.size, c.iter)
			if c.lat {
				row = latRow(c.size, c.iter)
			}
			require.Regexpf(t, row, cli.stdout, "client output:\n%s", cli.stdout)
			if c.serverRow {
				require.Regexpf(t, row, srv.stdout, "server output:\n%s", srv.stdout)
			}
			for _, out := range []string{srv.stdout, cli.stdout} {
				require.Contains(t, out, " local address: LID 0000 QPN 0x")
				require.Contains(t, out, " remote address: LID 0000 QPN 0x")
				require.True(t, strings.HasSuffix(out, "---------------------------------------------------------------------------------------\n"), out)
			}
			// Both ends are rxed: exact validation, no "peer is not rxed" note.
			require.NotContains(t, cli.stderr, "not rxed")
			require.NotContains(t, srv.stderr, "not rxed")
			cnt := readCounters(t, counters)
			require.Positive(t, cnt["sent_pkts"])
		})
	}
}

// TestPerfAllSizes runs -a (every size from 2 to 2^23) for a read test
// with few iterations.
func TestPerfAllSizes(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port := reservePort(t)
	common := []string{"-p", port, "-a", "-n", "3", "--validate", "--timeout", "20s", "--progress", "0"}
	srv, cli := runPair(t, append([]string{"perf", "write", "--addr", a}, common...), "Waiting for client",
		append(append([]string{"perf", "write", "--addr", b}, common...), "127.0.0.1"))
	requireOK(t, "server", srv)
	requireOK(t, "client", cli)
	for s := 2; s <= perfAllMax; s *= 2 {
		require.Regexp(t, bwRow(s, 3), cli.stdout)
	}
	// The server prints the client's last report and checked all 8 MiB.
	require.Regexp(t, bwRow(perfAllMax, 3), srv.stdout)
}

func TestPerfDuration(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port := reservePort(t)
	common := []string{"-p", port, "-D", "1", "-s", "4096", "--validate", "--timeout", "20s", "--progress", "200ms"}
	srv, cli := runPair(t, append([]string{"perf", "write", "--addr", a}, common...), "Waiting for client",
		append(append([]string{"perf", "write", "--addr", b}, common...), "127.0.0.1"))
	requireOK(t, "server", srv)
	requireOK(t, "client", cli)
	require.Regexp(t, `(?m)^ 4096       [0-9]+ +[0-9.]+ +[0-9.]+\s+[0-9.]+$`, cli.stdout)
	require.Contains(t, cli.stderr, "iterations in", "progress line")
}

func TestPatternAndAtomicChecks(t *testing.T) {
	b := make([]byte, 70000)
	fillPattern(b)
	require.Equal(t, -1, checkPattern(b))
	require.Equal(t, -1, checkPattern(b[:100]), "a prefix of the pattern is the pattern")
	b[65536] ^= 1
	require.Equal(t, 65536, checkPattern(b))

	// check feeds vals, as completed in that order, to one target's check.
	check := func(kind string, peer bool, vals ...uint64) error {
		c := &atomicCheck{cas: kind == "CMP_AND_SWAP"}
		for _, v := range vals {
			if err := c.add(v); err != nil {
				return err
			}
		}
		return c.finish(peer)
	}
	require.NoError(t, check("FETCH_AND_ADD", false, 7, 5, 6, 8))
	require.ErrorContains(t, check("FETCH_AND_ADD", false, 5, 6, 6, 8), "twice (lost add)")
	require.ErrorContains(t, check("FETCH_AND_ADD", false, 5, 6, 8), "returned 8 after 6 (lost or repeated")
	require.ErrorContains(t, check("FETCH_AND_ADD", true, 5, 6), "started at 5")
	require.NoError(t, check("CMP_AND_SWAP", true, 0, perfSwapValue, perfSwapValue))
	require.Error(t, check("CMP_AND_SWAP", true, 0, 0, perfSwapValue))
	require.NoError(t, check("CMP_AND_SWAP", false, 9, 9, 9))
	require.Error(t, check("CMP_AND_SWAP", false, 9, 8, 9))
}

func TestAtomicByteAccess(t *testing.T) {
	b := make([]byte, 16)
	for i := range b {
		atomicStoreByte(b, i, byte(i+1))
	}
	for i := range b {
		require.Equal(t, byte(i+1), b[i])
		require.Equal(t, byte(i+1), atomicLoadByte(b, i))
	}
}
