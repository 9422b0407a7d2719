//go:build unix

package main

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestServeSIGTERM runs the real command and sends the process SIGTERM:
// the daemon stops gracefully, msyncs, and exits 0.
func TestServeSIGTERM(t *testing.T) {
	a, b := addrPair(t)
	port := reservePort(t)
	file := tempPath(t, "data.img")
	require.NoError(t, os.WriteFile(file, make([]byte, 256<<10), 0o644))
	_, errOut, done := startCmd("serve", "--addr", a, "-p", port, "--export", "data=file:"+file+",size=128K")
	errOut.waitFor(t, `msg=serving`, 20*time.Second)
	w := runCmd("perf", "write", "--addr", b, "-p", port, "-s", "100000", "-n", "20", "--progress", "0", "127.0.0.1")
	requireOK(t, "perf write", w)
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGTERM))
	r := await(t, done, 20*time.Second)
	requireOK(t, "serve", r)
	require.Contains(t, r.stderr, "msg=\"shutting down\"")
	got, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, -1, checkPattern(got[:100000]))
}
