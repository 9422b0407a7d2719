package allreduce

import (
	"context"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/stretchr/testify/require"
)

// TestTCPSetupReturnsWhenCancelled: a rank joining a TCP ring returns
// when its context is cancelled while the next rank, which accepted its
// connection, never answers the hello. Bug (the workload audit, session
// AH): the hello exchange ended only at the setup's deadline (Timeout,
// a minute here), whatever the caller's context said.
func TestTCPSetupReturnsWhenCancelled(t *testing.T) {
	next, got := testenv.SilentTCPPeer(t, helloLen) // takes the hello, never answers
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-got
		cancel()
	}()
	done := make(chan error, 1)
	go func() {
		_, err := DialTCP(ctx, Config{Ranks: 2, Rank: 0, Count: 8, Timeout: time.Minute},
			TCPConfig{Listen: "127.0.0.1:0", Next: next})
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a cancelled DialTCP still waits for the next rank's hello")
	}
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "no answer from rank 1")
}
