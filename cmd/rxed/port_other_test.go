//go:build !linux

package main

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// reservePort returns a TCP port that was free a moment ago. Elsewhere
// than Linux a bound SO_REUSEADDR socket does not let a second listener
// share its port (BSD wants SO_REUSEPORT on both), so this is the racy
// check-then-bind fallback; see port_linux_test.go.
func reservePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}
