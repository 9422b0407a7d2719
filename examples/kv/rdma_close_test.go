package kv

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/stretchr/testify/require"
)

// waitFor waits for ch, failing the test after a generous deadline.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Errorf("no %s after 20 s", what)
	}
}

// requireReleased checks that a closed server left nothing behind: its
// CQs are free of QPs (a second Destroy is harmless, ErrBusy while a QP
// uses the CQ) and it holds no connection.
func requireReleased(t *testing.T, s *RDMAServer) {
	t.Helper()
	require.NoError(t, s.recvCQ.Destroy(), "a connection's QP was left on the receive CQ")
	require.NoError(t, s.sendCQ.Destroy(), "a connection's QP was left on the send CQ")
	require.Zero(t, s.Conns())
}

// Close racing an accept frees everything whichever gets there first.
// The hook holds the accept at one point, runs Close until it has taken
// its list of connections, lets the accept finish, then lets Close go
// on: Close before the connection is registered (it used to be
// registered anyway, after Close's list was taken, and its QP and region,
// then the CQs and the PD, were never freed), and Close after it.
func TestRDMACloseRacingAccept(t *testing.T) {
	for _, tc := range []struct {
		at       string // where the accept is when Close starts
		accepted bool   // whether the client gets connected
	}{
		{"register", false},
		{"accepting", true},
	} {
		t.Run(tc.at, func(t *testing.T) {
			r := newRig(t)
			require.NoError(t, r.rdma.Close())
			ctx := ctxT(t)

			var srv atomic.Pointer[RDMAServer]
			closing, acceptDone := make(chan struct{}), make(chan struct{})
			var doneOnce sync.Once
			closed := make(chan error, 1)
			hook := func(point string) {
				switch point {
				case tc.at:
					go func() { closed <- srv.Load().Close() }()
					waitFor(t, closing, "Close")
				case "closing":
					close(closing)
					waitFor(t, acceptDone, "end of the accept")
				case "accept done":
					doneOnce.Do(func() { close(acceptDone) })
				}
			}
			s, err := ServeRDMA(r.app, r.srvDev, r.cmAddr, &RDMAServerConfig{hook: hook})
			require.NoError(t, err)
			srv.Store(s)
			r.rdma = s

			c, err := DialRDMA(ctx, r.cliDev, r.cmAddr, nil)
			require.NoError(t, <-closed)
			requireReleased(t, s)
			if !tc.accepted {
				var rej *rdmacm.RejectError
				require.ErrorAs(t, err, &rej, "a server closing refuses the client")
				return
			}
			require.NoError(t, err)
			defer c.Close()
			// The accept disconnected it (Close had not seen it).
			_, err = c.Get(ctx, []byte("k"))
			require.ErrorIs(t, err, ErrConnLost)
		})
	}
}

// Rounds of Close racing a Dial, wherever Close lands: every round's
// server is freed whole.
func TestRDMACloseRacingDials(t *testing.T) {
	r := newRig(t)
	require.NoError(t, r.rdma.Close())
	ctx := ctxT(t)
	for round := range 10 {
		s, err := ServeRDMA(r.app, r.srvDev, r.cmAddr, nil)
		require.NoError(t, err)
		r.rdma = s
		dialed := make(chan error, 1)
		go func() {
			c, err := DialRDMA(ctx, r.cliDev, r.cmAddr, nil)
			if err == nil {
				_ = c.Close()
			}
			dialed <- err
		}()
		require.NoError(t, s.Close(), "round %d", round)
		requireReleased(t, s)
		if err := <-dialed; err != nil && !errors.Is(err, context.Canceled) {
			var rej *rdmacm.RejectError
			require.ErrorAs(t, err, &rej, "round %d", round)
		}
	}
}
