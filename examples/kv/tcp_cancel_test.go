package kv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/stretchr/testify/require"
)

// A TCP client's call returns when its context is cancelled, as the RDMA
// client's does, even with no deadline and a server that never answers
// (its host hung: the connection stays up). Bug (workload audit): the
// call only took the context's deadline, so a cancelled Get waited for
// the server for ever. The connection is dropped (a response may still
// come): the error wraps ErrConnLost and the cause, and the client
// reconnects to go on.
func TestTCPClientCallReturnsWhenCancelled(t *testing.T) {
	addr, got := testenv.SilentTCPPeer(t, reqHdrLen+1) // takes the request, never answers
	cl, err := DialTCP(ctxT(t), addr)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-got
		cancel()
	}()
	done := make(chan error, 1)
	go func() {
		_, err := cl.Get(ctx, []byte("k"))
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a cancelled Get still waits for the server")
	}
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, ErrConnLost)
	_, err = cl.Get(context.Background(), []byte("k"))
	require.True(t, errors.Is(err, ErrConnLost), "the next call fails at once: %v", err)
	// Close has nothing left to close: nil, as the RDMA client's (it
	// said "use of closed network connection"), and again.
	require.NoError(t, cl.Close())
	require.NoError(t, cl.Close())
}
