package allreduce

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// freePortBase finds n consecutive free TCP ports on 127.0.0.1 (a best
// effort: another process could take one before the ring listens).
func freePortBase(t *testing.T, n int) int {
	t.Helper()
	for try := 0; try < 50; try++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		base := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		ok := base+n < 65535
		for i := 1; i < n && ok; i++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", itoa(base+i)))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no run of free TCP ports")
	return 0
}

func itoa(i int) string { return fmtInt(i) }

func fmtInt(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}
