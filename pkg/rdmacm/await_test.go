package rdmacm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/cm"
)

// The CI run at f41480a failed cmd/rxed TestCmatoseMatchesRdmaCoreOutput/no_messages: the
// server (ucmatose -C 0) disconnects as soon as our RTU arrives, its DREQ closed the Conn's
// done while the handshake's EventEstablished still waited in hs, and await's select picked
// done: Dial failed with "rdmacm: disconnected" for a connection that had been made. A
// connection whose EventEstablished is queued when it ends is established (rdma_cm reports
// ESTABLISHED, then DISCONNECTED). select chooses at random, so each case runs 64 times.
func TestDialEstablishedThenDisconnectedAtOnce(t *testing.T) {
	for range 64 {
		c := &Conn{hs: make(chan cm.Event, 16), done: make(chan struct{})}
		c.hs <- cm.Event{Type: cm.EventEstablished}
		c.end(ErrDisconnected)
		require.NoError(t, c.await(context.Background(), nil))
		require.True(t, c.established)
		require.ErrorIs(t, c.Err(), ErrDisconnected, "the connection still ended")
	}
	for range 64 {
		c := &Conn{hs: make(chan cm.Event, 16), done: make(chan struct{})}
		c.end(ErrDisconnected)
		require.ErrorIs(t, c.await(context.Background(), nil), ErrDisconnected, "ended before it was established")
		require.False(t, c.established)
	}
}
