package allreduce

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTCPSetupReturnsWhenCancelled: a rank joining a TCP ring returns
// when its context is cancelled while the next rank, which accepted its
// connection, never answers the hello. Bug (the workload audit, session
// AH): the hello exchange ended only at the setup's deadline (Timeout,
// a minute here), whatever the caller's context said.
func TestTCPSetupReturnsWhenCancelled(t *testing.T) {
	next, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer next.Close()
	got := make(chan struct{})
	go func() {
		c, err := next.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var b [helloLen]byte
		if _, err := io.ReadFull(c, b[:]); err == nil {
			close(got) // the hello is here; no answer ever comes
		}
		_, _ = io.Copy(io.Discard, c)
	}()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-got
		cancel()
	}()
	done := make(chan error, 1)
	go func() {
		_, err := DialTCP(ctx, Config{Ranks: 2, Rank: 0, Count: 8, Timeout: time.Minute},
			TCPConfig{Listen: "127.0.0.1:0", Next: next.Addr().String()})
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a cancelled DialTCP still waits for the next rank's hello")
	}
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "no answer from rank 1")
}
