package kv

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// bigExtentApp is an App whose table takes values up to 256 KiB: the
// largest message is 256 KiB and change, which a connection's buffers
// were sized for at once.
func bigExtentApp(t *testing.T) *App {
	t.Helper()
	tab, err := NewTable(TableConfig{NBuckets: 64, ExtentSize: 256 << 10, MaxProbe: 4})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tab.Close() })
	return NewApp(tab)
}

// serveTCPForTest serves a on a loopback listener with cfg, closed at the
// end of the test.
func serveTCPForTest(t *testing.T, a *App, cfg *TCPServerConfig) *TCPServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s, err := ServeTCPWith(a, ln, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func (s *TCPServer) connCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// rawCall writes req on c and reads its response.
func rawCall(t *testing.T, c net.Conn, br *bufio.Reader, req []byte) (response, []byte) {
	t.Helper()
	_, err := c.Write(req)
	require.NoError(t, err)
	return readResponse(t, c, br)
}

// At most MaxConns TCP connections are served at once: one beyond them
// is answered busy and closed at once (counted in Refused), before the
// server reads from it or allocates for it, and a connection that ends makes room for the
// next. Bug (workload review, task BF): the TCP server had no cap, so a
// flood of connections held a goroutine and its buffers each, without
// bound.
func TestTCPServerCapsConnections(t *testing.T) {
	const max = 4
	s := serveTCPForTest(t, bigExtentApp(t), &TCPServerConfig{MaxConns: max})
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", s.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	served := func(c net.Conn) {
		t.Helper()
		resp, _ := rawCall(t, c, bufio.NewReader(c), append(rawRequest(opGet, 1, 1, 0), 'k'))
		require.Equal(t, statusNotFound, resp.status)
	}
	var conns []net.Conn
	for range max {
		c := dial()
		served(c)
		conns = append(conns, c)
	}
	for i := range 3 {
		requireBusyThenClosed(t, dial())
		require.Equal(t, uint64(i+1), s.Refused())
	}
	require.Equal(t, max, s.connCount())
	for _, c := range conns {
		served(c) // the refusals touched none of them
	}
	// One that ends makes room.
	require.NoError(t, conns[0].Close())
	require.Eventually(t, func() bool { return s.connCount() == max-1 }, 10*time.Second, time.Millisecond)
	served(dial())
	requireBusyThenClosed(t, dial())
	require.Equal(t, uint64(4), s.Refused())
}

// TCPServerConfig's MaxConns: 0 is DefaultMaxConns, negative refused.
func TestTCPServerConfigMaxConns(t *testing.T) {
	s := serveTCPForTest(t, bigExtentApp(t), nil)
	require.Equal(t, DefaultMaxConns, s.maxConns)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	_, err = ServeTCPWith(NewApp(nil), ln, &TCPServerConfig{MaxConns: -1})
	require.ErrorContains(t, err, "MaxConns -1")
}
