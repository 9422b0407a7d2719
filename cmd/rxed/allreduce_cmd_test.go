package main

import (
	"strings"
	"testing"

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
}

func TestAllreduceBadFlags(t *testing.T) {
	requireOneLineError(t, runCmd("allreduce", "--ranks", "1"), "at least 2")
	requireOneLineError(t, runCmd("allreduce", "-b", "8K", "-e", "4K"), "-e")
	requireOneLineError(t, runCmd("allreduce", "--net", "ib"), "--net")
}
