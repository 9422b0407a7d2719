package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/internal/testenv"
)

// The rdma_cm tools (rping, cmatose, udaddy) run here as two in-process
// rxed commands on a 127.0.2.x address pair each, on their default
// rdma_cm ports: a service ID is per address, so parallel tests do not
// meet. Their output is checked line by line against what the C tools
// printed in ../shared/pcaps/logs for the same arguments.

// toolLog returns the lines a C tool printed in the shared capture logs
// (the "# ..." command and exit lines left out).
func toolLog(t *testing.T, name string) []string {
	t.Helper()
	b, err := os.ReadFile(testenv.SharedPath(t, "pcaps", "logs", name))
	require.NoError(t, err)
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return lines
}

// outLines splits a command's output into lines, dropping those that
// start with any of skip (rping's -d lines).
func outLines(s string, skip ...string) []string {
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		keep := l != ""
		for _, p := range skip {
			if strings.HasPrefix(l, p) {
				keep = false
			}
		}
		if keep {
			lines = append(lines, l)
		}
	}
	return lines
}

// only keeps the lines containing sub.
func only(lines []string, sub string) []string {
	var out []string
	for _, l := range lines {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

// runToolPair is runPair for the rdma_cm tools: it also fails at once,
// with the server's output, when the server exits before it listens.
func runToolPair(t *testing.T, server []string, ready string, client []string) (srv, cli result) {
	t.Helper()
	sout, serr, sdone := startCmd(server...)
	waitListening(t, sout, serr, sdone, ready)
	cli = runCmd(client...)
	srv = await(t, sdone, 60*time.Second)
	return srv, cli
}

// waitListening waits for the server's ready line, failing with its
// output if it exits first.
func waitListening(t *testing.T, sout, serr *syncBuffer, sdone <-chan result, ready string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for !strings.Contains(sout.String(), ready) {
		sout.mu.Lock()
		ch := sout.changed
		sout.mu.Unlock()
		if strings.Contains(sout.String(), ready) {
			break
		}
		select {
		case <-ch:
		case r := <-sdone:
			t.Fatalf("server exited with %d before %q:\nstdout:\n%s\nstderr:\n%s", r.code, ready, r.stdout, r.stderr)
		case <-deadline:
			t.Fatalf("%q did not appear within 20s; stdout:\n%s\nstderr:\n%s", ready, sout.String(), serr.String())
		}
	}
}

// rpingDebug are the -d lines rxed rping prints (the tests use
// "rdma_listen" to know the server listens).
var rpingDebug = []string{"rdma_bind_addr successful", "rdma_listen", "rdma_connect successful"}

// rpingData is what rping -v prints for pings 0..n-1 of size bytes.
func rpingData(prefix string, n, size int) []string {
	buf := make([]byte, size)
	var lines []string
	start := byte('A')
	for i := range n {
		rpingFill(buf, i, start)
		if start++; start > 'z' {
			start = 'A'
		}
		lines = append(lines, prefix+string(cString(buf)))
	}
	return lines
}

func TestRpingMatchesRdmaCoreOutput(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	// The capture's commands: rping -s -a SERVER -C 3 -v -V and
	// rping -c -a SERVER -C 3 -v -V -S 64.
	srv, cli := runToolPair(t,
		[]string{"rping", "-s", "-a", a, "-C", "3", "-v", "-V", "-d", "--timeout", "20s"}, "rdma_listen",
		[]string{"rping", "-c", "-a", a, "-I", b, "-C", "3", "-v", "-V", "-S", "64", "--timeout", "20s"})
	requireOK(t, "server", srv)
	requireOK(t, "client", cli)
	require.Equal(t, toolLog(t, "rdmacm_rping_v4.client.txt"), outLines(cli.stdout, rpingDebug...))
	want := toolLog(t, "rdmacm_rping_v4.server.txt")
	require.Equal(t, only(want, "ping data"), outLines(srv.stdout, rpingDebug...), "server stdout")
	// rping's two lines on stderr when the client has gone.
	require.Equal(t, []string{"server DISCONNECT EVENT...", "wait for RDMA_READ_ADV state 10"}, outLines(srv.stderr))
	require.Empty(t, cli.stderr)
	require.Equal(t, rpingData("ping data: ", 3, 64), outLines(cli.stdout, rpingDebug...), "the log is rping's pattern")
}

func TestRpingSizesAndWrap(t *testing.T) {
	t.Parallel()
	// 60 pings wrap the pattern's start past 'z'; the sizes are rping's
	// minimum and a multi-packet buffer (READ and WRITE responses of
	// several MTUs).
	for _, size := range []int{rpingMinSize, 5000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			t.Parallel()
			a, b := addrPair(t)
			sz := fmt.Sprint(size)
			srv, cli := runToolPair(t,
				[]string{"rping", "-s", "-a", a, "-S", sz, "-v", "-d", "--timeout", "20s"}, "rdma_listen",
				[]string{"rping", "-c", "-a", a, "-I", b, "-C", "60", "-S", sz, "-v", "-V", "--timeout", "20s"})
			requireOK(t, "server", srv)
			requireOK(t, "client", cli)
			require.Equal(t, rpingData("ping data: ", 60, size), outLines(cli.stdout))
			require.Equal(t, rpingData("server ping data: ", 60, size), outLines(srv.stdout, rpingDebug...))
		})
	}
}

func TestRpingPersistentServer(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	sout, serr, sdone := startCmd("rping", "-s", "-P", "--clients", "2", "-a", a, "-S", "100", "-v", "-d", "--timeout", "20s")
	waitListening(t, sout, serr, sdone, "rdma_listen")
	c1 := runCmd("rping", "-c", "-a", a, "-I", b, "-C", "2", "-V", "-v", "--timeout", "20s")
	requireOK(t, "client 1", c1)
	c2 := runCmd("rping", "-c", "-a", a, "-I", b, "-C", "3", "-V", "-v", "-S", "100", "--timeout", "20s")
	requireOK(t, "client 2", c2)
	srv := await(t, sdone, 60*time.Second)
	requireOK(t, "server", srv)
	require.Equal(t, rpingData("ping data: ", 2, 64), outLines(c1.stdout))
	require.Equal(t, rpingData("ping data: ", 3, 100), outLines(c2.stdout))
	// The server READs as many bytes as each client advertises.
	require.Equal(t, append(rpingData("server ping data: ", 2, 64), rpingData("server ping data: ", 3, 100)...),
		outLines(srv.stdout, rpingDebug...))
	require.Equal(t, 2, strings.Count(srv.stderr, "server DISCONNECT EVENT..."), srv.stderr)
}

func TestRpingUnderLoss(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	srv, cli := runToolPair(t,
		[]string{"rping", "-s", "-a", a, "-v", "-d", "-S", "3000", "--timeout", "20s", "--ack-timeout", "14", "--fault", "loss=0.05,seed=21"}, "rdma_listen",
		[]string{"rping", "-c", "-a", a, "-I", b, "-C", "30", "-S", "3000", "-V", "-v", "--timeout", "20s", "--ack-timeout", "14", "--fault", "loss=0.05,seed=22"})
	requireOK(t, "server", srv)
	requireOK(t, "client", cli)
	require.Equal(t, rpingData("ping data: ", 30, 3000), outLines(cli.stdout))
	require.Equal(t, rpingData("server ping data: ", 30, 3000), outLines(srv.stdout, rpingDebug...))
}

func TestCmatoseMatchesRdmaCoreOutput(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, log string
		args      []string
	}{
		{"one", "rdmacm_ucmatose", []string{"-C", "5"}},
		{"three", "rdmacm_ucmatose_3conn", []string{"-c", "3", "-C", "2"}},
		{"eight", "rdmacm_ucmatose_3conn", []string{"-c", "8", "-C", "20", "-S", "3000"}},
		{"defaults", "rdmacm_ucmatose", nil},
		{"loss", "rdmacm_ucmatose", []string{"-c", "2", "-C", "20", "-S", "2000", "--ack-timeout", "14", "--fault", "loss=0.05,seed=31"}},
		{"no_messages", "", []string{"-C", "0"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b := addrPair(t)
			common := append([]string{"--timeout", "20s"}, tc.args...)
			srv, cli := runToolPair(t,
				append([]string{"cmatose", "-b", a}, common...), "cmatose: starting server",
				append([]string{"cmatose", "-s", a, "-b", b}, common...))
			requireOK(t, "server", srv)
			requireOK(t, "client", cli)
			if tc.log == "" {
				require.Equal(t, []string{"cmatose: starting server", "cmatose: disconnecting", "disconnected", "test complete", "return status 0"}, outLines(srv.stdout))
				require.Equal(t, []string{"cmatose: starting client", "cmatose: connecting", "test complete", "return status 0"}, outLines(cli.stdout))
				return
			}
			require.Equal(t, toolLog(t, tc.log+".server.txt"), outLines(srv.stdout))
			require.Equal(t, toolLog(t, tc.log+".client.txt"), outLines(cli.stdout))
			require.Empty(t, srv.stderr)
			require.Empty(t, cli.stderr)
		})
	}
}

func TestUdaddyMatchesRdmaCoreOutput(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
	}{
		{"one", []string{"-C", "5"}},
		{"three", []string{"-c", "3", "-C", "4", "-S", "1000"}},
		{"max_size", []string{"-C", "3", "-S", "4096"}},
		// UD has no retransmission: udaddy (the C tool too) waits for
		// every datagram, so lost data would hang it until --timeout.
		// Duplication and reordering it must survive, and the SIDR
		// exchange must survive duplicated MADs.
		{"dup_reorder", []string{"-c", "2", "-C", "20", "--fault", "dup=0.1,reorder=0.1,seed=41"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b := addrPair(t)
			common := append([]string{"--timeout", "20s"}, tc.args...)
			srv, cli := runToolPair(t,
				append([]string{"udaddy", "-b", a}, common...), "udaddy: starting server",
				append([]string{"udaddy", "-s", a, "-b", b}, common...))
			requireOK(t, "server", srv)
			requireOK(t, "client", cli)
			require.Equal(t, toolLog(t, "rdmacm_udaddy.server.txt"), outLines(srv.stdout))
			require.Equal(t, toolLog(t, "rdmacm_udaddy.client.txt"), outLines(cli.stdout))
		})
	}
}

// TestToolsAgainstNoServer: a client whose REQ nobody listens for gets
// REJ 8 (invalid service ID), as rping did in rdmacm_rej_no_listener.pcap,
// and says so in one line, well within --timeout.
func TestToolsAgainstNoServer(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args func(a, b string) []string
		want func(a string) []string
	}{
		{"rping", func(a, b string) []string { return []string{"rping", "-c", "-a", a, "-I", b, "-C", "1"} },
			func(a string) []string {
				return []string{"rxed rping: connect " + a + ":7174: rejected: invalid service ID (8)"}
			}},
		{"cmatose", func(a, b string) []string { return []string{"cmatose", "-s", a, "-b", b, "-c", "4"} },
			func(a string) []string {
				return []string{"rxed cmatose: connect " + a + ":7471: rejected: invalid service ID (8)"}
			}},
		{"udaddy", func(a, b string) []string { return []string{"udaddy", "-s", a, "-b", b} },
			func(a string) []string { return []string{"rxed udaddy: connect " + a + ":7174: "} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b := addrPair(t)
			// The "server" engine runs, with nothing listening.
			sout, serr, sdone := startCmd("rping", "-s", "-a", a, "-d", "-p", "17174", "--wait", "30s", "--timeout", "20s")
			waitListening(t, sout, serr, sdone, "rdma_listen")
			begin := time.Now()
			r := runCmd(append(tc.args(a, b), "--timeout", "15s")...)
			requireOneLineError(t, r, tc.want(a)...)
			require.Equal(t, 1, r.code)
			require.Less(t, time.Since(begin), 15*time.Second)
			// A client on the port the engine does listen on ends it.
			requireOK(t, "server's own client", runCmd("rping", "-c", "-a", a, "-I", b, "-p", "17174", "-C", "1", "--timeout", "20s"))
			requireOK(t, "server", await(t, sdone, 30*time.Second))
		})
	}
}

func TestRdmacmToolsBadFlags(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"rping"}, "exactly one of -s"},
		{[]string{"rping", "-s", "-c", "-a", "127.0.0.1"}, "exactly one of -s"},
		{[]string{"rping", "-c"}, "-c needs -a"},
		{[]string{"rping", "-c", "-a", "nohost"}, "not an IP address"},
		{[]string{"rping", "-s", "-a", "127.0.0.1", "-S", "25"}, "valid range is 26 to 65535"},
		{[]string{"rping", "-s", "-a", "127.0.0.1", "-S", "65536"}, "invalid size"},
		{[]string{"rping", "-c", "-a", "127.0.0.1", "-C", "-1"}, "invalid count"},
		{[]string{"rping", "-s", "-a", "127.0.0.1", "-p", "70000"}, "out of range"},
		{[]string{"rping", "-s", "-a", "127.0.0.1", "--clients", "2"}, "needs -P"},
		{[]string{"rping", "-s", "-I", "127.0.0.1", "-a", "127.0.0.1"}, "-I is the client's"},
		{[]string{"rping", "-s"}, "--addr or -a is required"},
		{[]string{"rping", "-x"}, "flag provided but not defined"},
		{[]string{"rping", "-s", "-a", "127.0.0.1", "--ack-timeout", "32"}, "--ack-timeout 32"},
		{[]string{"rping", "-s", "-a", "127.0.0.1", "extra"}, "unexpected arguments"},
		{[]string{"cmatose", "-c", "0", "-b", "127.0.0.1"}, "-c 0"},
		{[]string{"cmatose", "-C", "-2", "-b", "127.0.0.1"}, "-C -2"},
		{[]string{"cmatose", "-S", "-1", "-b", "127.0.0.1"}, "-S -1"},
		{[]string{"cmatose", "-s", "x.y"}, "not an IP address"},
		{[]string{"cmatose"}, "--addr or -b is required"},
		{[]string{"cmatose", "-b", "127.0.0.1", "--fault", "loss=2"}, "--fault"},
		{[]string{"udaddy", "-b", "127.0.0.1", "-S", "5000"}, "larger than active mtu 4096"},
		{[]string{"udaddy", "-b", "127.0.0.1", "-P", "ipoib"}, "only the udp port space"},
		{[]string{"udaddy", "-b", "127.0.0.1", "-p", "0"}, "out of range"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, "_"), func(t *testing.T) {
			r := runCmd(tc.args...)
			require.Equal(t, 2, r.code, "stdout %q stderr %q", r.stdout, r.stderr)
			requireOneLineError(t, r, tc.want, "rxed "+tc.args[0]+":")
		})
	}
}
