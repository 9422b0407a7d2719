package main

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Both transports, nccl-tests columns, every result bit-exact (#wrong 0).
func TestAllreduceCommand(t *testing.T) {
	r := runCmd("allreduce", "--net", "mem", "--addr", "10.9.0.1", "--tcp-port", "17650", "--ranks", "2,3", "-b", "4K", "-e", "16K", "-n", "1", "--timeout", "10s")
	requireOK(t, "allreduce", r)
	lines := 0
	for _, l := range strings.Split(r.stdout, "\n") {
		f := strings.Fields(l)
		if len(f) == 13 && f[2] == "float" && f[3] == "sum" {
			lines++
			require.Equal(t, "0", f[8], "rdma #wrong: %s", l)
			require.Equal(t, "0", f[12], "tcp #wrong: %s", l)
		}
	}
	require.Equal(t, 6, lines, r.stdout) // 4K, 8K, 16K for 2 and 3 ranks
	require.Contains(t, r.stdout, "busbw")
	// ranks in one process keep the runtime's choice of CPUs, and say it
	require.Contains(t, r.stdout, fmt.Sprintf(", GOMAXPROCS %d, load", runtime.GOMAXPROCS(0)))
	// -n 1 is one iteration (newcomer walk, session AI: "1 iterations").
	require.Contains(t, r.stdout, "(mem), 1 iteration per size, ")
}

func TestAllreduceBadFlags(t *testing.T) {
	requireOneLineError(t, runCmd("allreduce", "--ranks", "1"), "at least 2")
	requireOneLineError(t, runCmd("allreduce", "-b", "8K", "-e", "4K"), "-e")
	requireOneLineError(t, runCmd("allreduce", "--net", "ib"), "--net")
	requireOneLineError(t, runCmd("allreduce", "--cpus", "-2"), "--cpus -2")
}

// --spin says how the RDMA ranks wait, with the tools' meaning (0 sleeps
// at once, -1 never sleeps: waiterSpin), in the header; every mode is
// bit-exact, and a bad value is a usage error.
func TestAllreduceSpin(t *testing.T) {
	for _, c := range []struct {
		spin, header string
	}{
		{"", "RDMA ranks spin 50µs then sleep (--spin)"},
		{"80us", "RDMA ranks spin 80µs then sleep (--spin)"},
		{"0", "RDMA ranks sleep at once (--spin 0)"},
		{"-1", "RDMA ranks never sleep (--spin -1)"},
	} {
		args := []string{"allreduce", "--net", "mem", "--addr", "10.9.0.1", "--tcp-port", "17660", "--ranks", "2", "-b", "4K", "-e", "4K", "-n", "1", "--timeout", "10s"}
		if c.spin != "" {
			args = append(args, "--spin", c.spin)
		}
		r := runCmd(args...)
		requireOK(t, "allreduce --spin "+c.spin, r)
		require.Contains(t, r.stdout, c.header)
		f := strings.Fields(strings.Split(strings.TrimSpace(r.stdout), "\n")[3])
		require.Len(t, f, 13, r.stdout)
		require.Equal(t, "0", f[8], "rdma #wrong with --spin %s: %s", c.spin, r.stdout)
	}
	requireOneLineError(t, runCmd("allreduce", "--spin", "soon"), "spin")
}

// A rank process spins by default only while the ring has no more ranks
// than the host has CPUs (rankProcessSpin says why).
func TestRankProcessSpin(t *testing.T) {
	for _, c := range []struct {
		ranks, cpus int
		want        time.Duration
	}{
		{2, 2, defaultSpin},
		{2, 8, defaultSpin},
		{8, 8, defaultSpin},
		{3, 2, 0},
		{4, 2, 0},
		{64, 16, 0},
	} {
		require.Equal(t, c.want, rankProcessSpin(c.ranks, c.cpus), "%d ranks on %d CPUs", c.ranks, c.cpus)
	}
}
