package kv

import (
	"testing"

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
