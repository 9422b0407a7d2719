package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPingpongRefusesBadSizeAndServiceLevel: pingpong's usage errors name
// the value the user gave, and a service level outside the 4 bits of the
// address vector's SL is a usage error on each side before any exchange.
//
// Bug (found by the tools audit, session AF): `-s 3000000000` was refused
// as "-s 2147483648: too large" (the size clamped before the message), and
// `-l 16` passed the parse: the server failed in its RTR transition after
// the TCP exchange had begun, and its client only saw "sent 0 bytes, want
// 52" (an -l of 300 was even cut to 44 by the uint8 conversion).
func TestPingpongRefusesBadSizeAndServiceLevel(t *testing.T) {
	t.Parallel()
	a, _ := addrPair(t)
	// The -l cases are clients of a port nobody listens on, so that
	// before the fix they failed (connection refused) instead of waiting.
	port := reservePort(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-s", "3000000000"}, "-s 3000000000"},
		{[]string{"-s", "4G"}, "-s 4294967296"},
		{[]string{"-l", "16", "-p", port, "127.0.0.1"}, "-l 16"},
		{[]string{"-l", "300", "-p", port, "127.0.0.1"}, "-l 300"},
	} {
		r := runCmd(append([]string{"pingpong", "--addr", a}, c.args...)...)
		requireOneLineError(t, r, c.want)
		require.Equal(t, 2, r.code, "%v: %s", c.args, r.stderr)
	}
}
