package main

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func addrs(s ...string) []netip.Addr {
	var a []netip.Addr
	for _, v := range s {
		a = append(a, netip.MustParseAddr(v))
	}
	return a
}

// TestChooseProcs: a tool takes half the CPUs only when its peer is
// certainly on this host (issue 14, goal 3: two runtimes of NumCPU Ps
// each on a 2-core host got the tools 0.5-0.7x of the library), and a
// rank process of a loopback ring its share.
func TestChooseProcs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cpus   int
		flag   int
		env    string
		addrs  []netip.Addr
		shares int
		want   int
		reason string
	}{
		{"loopback v4 halves", 2, 0, "", addrs("127.0.9.1"), 2, 1, "loopback"},
		{"loopback v6 halves", 8, 0, "", addrs("::1"), 2, 4, "loopback"},
		{"v4-mapped loopback halves", 4, 0, "", addrs("::ffff:127.0.0.1"), 2, 2, "loopback"},
		{"odd count rounds down", 3, 0, "", addrs("127.0.0.1"), 2, 1, "loopback"},
		{"every address must be loopback", 4, 0, "", addrs("127.0.0.1", "10.0.0.1"), 2, 0, ""},
		{"a routable address keeps every CPU", 4, 0, "", addrs("192.168.1.5"), 2, 0, ""},
		{"one CPU is left alone", 1, 0, "", addrs("127.0.0.1"), 2, 0, ""},
		{"no address", 4, 0, "", nil, 2, 0, ""},
		{"GOMAXPROCS wins over the default", 4, 0, "3", addrs("127.0.0.1"), 2, 0, ""},
		{"--cpus wins over GOMAXPROCS", 4, 3, "1", addrs("127.0.0.1"), 2, 3, "--cpus"},
		{"--cpus with a remote peer", 4, 4, "", addrs("10.0.0.1"), 2, 4, "--cpus"},
		{"peers in this process keep every CPU", 4, 0, "", addrs("127.0.0.1"), 1, 0, ""},
		{"--cpus with peers in this process", 4, 2, "", addrs("127.0.0.1"), 1, 2, "--cpus"},
		{"4 rank processes on 2 CPUs take 1 each", 2, 0, "", addrs("127.0.8.1", "127.0.8.2", "127.0.8.3", "127.0.8.4"), 4, 1, "4 processes share this host's 2 CPUs"},
		{"3 rank processes on 8 CPUs take 2 each", 8, 0, "", addrs("127.0.8.1", "127.0.8.2", "127.0.8.3"), 3, 2, "3 processes"},
		{"8 rank processes on 4 CPUs take at least 1", 4, 0, "", addrs("127.0.8.1"), 8, 1, "8 processes"},
		{"rank processes with a remote peer keep every CPU", 4, 0, "", addrs("127.0.8.1", "10.0.0.2"), 4, 0, ""},
		{"GOMAXPROCS wins for rank processes too", 2, 0, "2", addrs("127.0.8.1"), 4, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, why := chooseProcs(tc.cpus, tc.flag, tc.env, tc.addrs, tc.shares)
			require.Equal(t, tc.want, n)
			require.Contains(t, why, tc.reason)
			if n == 0 {
				require.Empty(t, why)
			}
		})
	}
}

func TestCPUsFlagRejectsNegative(t *testing.T) {
	r := runCmd("perf", "write", "--addr", "127.0.0.1", "--cpus", "-1")
	require.Equal(t, 2, r.code, "stderr: %s", r.stderr)
	require.Contains(t, r.stderr, "--cpus -1")
}

// TestPerfProcessesShareCPUs runs `rxed perf write` as two processes on
// loopback, as an operator does, with GOMAXPROCS absent from their
// environment: each must run with half the CPUs and still finish.
func TestPerfProcessesShareCPUs(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("one CPU: nothing to share (chooseProcs leaves it alone; TestChooseProcs covers it)")
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOMAXPROCS=") {
			env = append(env, kv)
		}
	}
	ad := rankAddrs(t, 2)
	port := reservePort(t)
	common := []string{"-p", port, "-s", "4096", "-n", "200", "--validate", "--timeout", "20s", "--progress", "0", "--debug"}
	srv := startProcessEnv(t, env, append([]string{"perf", "write", "--addr", ad[0]}, common...)...)
	srv.stdout.waitFor(t, "Waiting for client", 30*time.Second)
	cli := startProcessEnv(t, env, append(append([]string{"perf", "write", "--addr", ad[1]}, common...), ad[0])...)
	cli.wait(t, 60*time.Second)
	srv.wait(t, 60*time.Second)
	want := fmt.Sprintf("procs=%d", runtime.NumCPU()/2)
	for name, p := range map[string]*rankProc{"server": srv, "client": cli} {
		stderr := p.stderrOf(t)
		require.Equalf(t, 0, p.code, "%s exited %d\nstdout:\n%s\nstderr:\n%s", name, p.code, p.stdout, stderr)
		require.Containsf(t, stderr, "msg=GOMAXPROCS "+want, "%s did not take half the CPUs:\n%s", name, stderr)
	}
	require.Regexp(t, bwRow(4096, 200), cli.stdout.String())
}

// TestApplyCPUs: check applies the choice through setMaxProcs (which
// main sets), records it for the debug log, and leaves a command whose
// peers are in its own process (kv bench --inproc) alone unless --cpus
// says otherwise. Not parallel: it swaps the package's setMaxProcs.
func TestApplyCPUs(t *testing.T) {
	var calls []int
	setMaxProcs = func(n int) int { calls = append(calls, n); return 99 }
	t.Cleanup(func() { setMaxProcs = nil })
	loop := addrs("127.0.0.1")

	e := engineFlags{addrs: loop, peerInProcess: true}
	e.applyCPUs("")
	require.Empty(t, calls, "both ends in this process: nothing to share")

	e = engineFlags{addrs: loop, peerInProcess: true, cpus: 3}
	e.applyCPUs("")
	require.Equal(t, []int{3}, calls, "--cpus still applies")
	require.Equal(t, cpuChoice{procs: 3, was: 99, why: "--cpus"}, e.cpuChoice)

	calls = nil
	e = engineFlags{addrs: addrs("10.1.2.3")}
	e.applyCPUs("")
	require.Empty(t, calls, "a routable address keeps the runtime's choice")

	if runtime.NumCPU() >= 2 {
		e = engineFlags{addrs: loop}
		e.applyCPUs("")
		require.Equal(t, []int{runtime.NumCPU() / 2}, calls)
		require.Contains(t, e.cpuChoice.why, "loopback")
	}
}
