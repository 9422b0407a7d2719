package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServersSayTheirWaitRanOut: a server whose client never comes ends
// after --wait with exit 1 and says so: "no client within --wait D".
// Bug (found by the tools audit, session AF): rping, cmatose, udaddy,
// perf and pingpong ended with Go's "context deadline exceeded".
func TestServersSayTheirWaitRanOut(t *testing.T) {
	t.Parallel()
	for name, args := range map[string][]string{
		"rping":    {"rping", "-s", "-p", "17998"}, // rdma_cm ports: no socket
		"cmatose":  {"cmatose"},
		"udaddy":   {"udaddy"},
		"perf":     {"perf", "write", "-p"}, // TCP ports: a free one
		"pingpong": {"pingpong", "-p"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a, _ := addrPair(t)
			if args[len(args)-1] == "-p" {
				args = append(args, reservePort(t))
			}
			r := runCmd(append(args, "--addr", a, "--wait", "50ms", "--timeout", "5s")...)
			require.Equal(t, 1, r.code, "stdout %s\nstderr %s", r.stdout, r.stderr)
			require.Contains(t, r.stderr, "no client within --wait 50ms")
			require.NotContains(t, r.stderr, "deadline exceeded")
		})
	}
}
