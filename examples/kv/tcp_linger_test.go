package kv

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A PUT whose value is longer than any server reads past (its header
// claims more than a 1 MiB extent's request) gets the refusal,
// ErrValueLen, however much of the value the client is still writing when
// the server answers: the server half-closes after the refusal and reads
// the rest of the request away before it closes (lingeringClose). Bug
// (workload audit): the server closed at once with the value's unread
// bytes in its receive buffer, so Linux reset the connection (tcp_close
// with unread data sends RST, RFC 2525 2.17) and the client, still
// writing its 16 MiB, failed with ECONNRESET ("connection lost") instead
// of reading the refusal.
func TestTCPServerRefusalOfAnOversizedPutIsNotLostToAReset(t *testing.T) {
	r := newRig(t)
	ctx := ctxT(t)
	cl := r.tcpClient()
	// More than the kernel buffers between the two (a 4 MiB send buffer
	// and the server's receive window): the write is still going on when
	// the server answers.
	val := make([]byte, 16<<20)
	require.ErrorIs(t, cl.Put(ctx, []byte("k"), val), ErrValueLen)
	// The server closed the connection after its answer; a reconnected
	// client goes on.
	require.NoError(t, cl.Reconnect(ctx))
	require.NoError(t, cl.Put(ctx, []byte("k"), []byte("v")))
}

// At most maxLingering refused connections linger at once: each holds its
// goroutine and buffers while it reads away what its client may still
// send, so one refused beyond them is closed at once after its refusal,
// and a connection that stops lingering gives its place to the next.
// Every client here claims a gigabyte and sends nothing more, so each
// would linger for the server's whole linger bound (a minute here). Bug
// (workload audit): every refused connection lingered up to a second, so
// a burst of them piled up a goroutine (and a few MiB of buffers) each.
func TestTCPServerBoundsLingeringRefusals(t *testing.T) {
	r := newRig(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := serveTCP(r.app, ln, DefaultMaxConns, time.Minute)
	t.Cleanup(func() { _ = s.Close() })
	conns := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns)
	}
	// refused connects, claims a gigabyte and reads the refusal and the
	// server's FIN: the server is lingering or has closed.
	refused := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		_, err = c.Write(rawRequest(opPut, 7, 1, 1<<30))
		require.NoError(t, err)
		br := bufio.NewReader(c)
		resp, _ := readResponse(t, c, br)
		require.Equal(t, statusBadValue, resp.status)
		_, err = br.ReadByte()
		require.ErrorIs(t, err, io.EOF, "the server half-closed after its refusal")
		return c
	}
	var lingering []net.Conn
	for range maxLingering {
		lingering = append(lingering, refused())
	}
	require.Eventually(t, func() bool { return len(s.lingerSlots) == maxLingering }, 10*time.Second, time.Millisecond,
		"the first %d refused connections linger", maxLingering)
	refused()
	require.Eventually(t, func() bool { return conns() == maxLingering }, 10*time.Second, time.Millisecond,
		"a refused connection beyond %d lingering is closed at once", maxLingering)
	require.Len(t, s.lingerSlots, maxLingering)
	// One that ends (its client closed) frees its place: the next refused
	// connection lingers.
	require.NoError(t, lingering[0].Close())
	require.Eventually(t, func() bool { return len(s.lingerSlots) == maxLingering-1 }, 10*time.Second, time.Millisecond)
	refused()
	require.Eventually(t, func() bool { return len(s.lingerSlots) == maxLingering && conns() == maxLingering }, 10*time.Second, time.Millisecond)
}
