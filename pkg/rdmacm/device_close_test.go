package rdmacm_test

import (
	"context"
	"errors"
	"net/netip"
	"runtime"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// The waits below depend on the device's CM for their answer. When the
// device closes, the agent stops the CM, which calls no handler after
// that, so each wait must also end on the agent going away. Bug (found
// by an audit of hangs on close, session AE): DialUD, Listener.Accept and
// a Dial whose REQ left just before the close waited on their context
// alone: with context.Background() they never returned.

// TestDialUDEndsWhenTheDeviceCloses: a SIDR query to a peer that does not
// answer (it would retry for about a minute) ends with ib.ErrDeviceClosed
// when its device closes.
func TestDialUDEndsWhenTheDeviceCloses(t *testing.T) {
	net := transport.NewMemNetwork()
	dev := rdmacm.MemDevice(t, net, "10.0.3.1")
	done := make(chan error, 1)
	go func() {
		_, err := rdmacm.DialUD(context.Background(), dev, netip.MustParseAddrPort("10.0.3.9:7471"), nil) // nobody there
		done <- err
	}()
	for rdmacm.Counters(dev)["tx_sidr_req"] == 0 { // the query is out: DialUD waits for its answer
		runtime.Gosched()
	}
	require.NoError(t, dev.Close())
	err := returnsWithin(t, "DialUD after Device.Close", func() error { return <-done })
	require.ErrorIs(t, err, ib.ErrDeviceClosed)
}

// TestAcceptEndsWhenTheDeviceCloses: a listener's Accept ends with
// ib.ErrDeviceClosed when its device closes (rdma_cm's
// RDMA_CM_EVENT_DEVICE_REMOVAL), and the listener can still be closed.
func TestAcceptEndsWhenTheDeviceCloses(t *testing.T) {
	net := transport.NewMemNetwork()
	dev := rdmacm.MemDevice(t, net, "10.0.3.1")
	l, err := rdmacm.Listen(dev, netip.MustParseAddrPort("10.0.3.1:7471"), nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := l.Accept(context.Background())
		done <- err
	}()
	require.NoError(t, dev.Close())
	err = returnsWithin(t, "Accept after Device.Close", func() error { return <-done })
	require.ErrorIs(t, err, ib.ErrDeviceClosed)
	l.Close()
}

// TestDialRacingDeviceCloseReturns: a Dial racing its device's Close, at
// every offset a hundred scheduler turns can make, returns (with a
// refusal, ib.ErrDeviceClosed or another error), never hangs. Before the
// fix it hung within a few dozen rounds: the REQ left, the close hook had
// already taken its list of connections, and the CM's stop dropped the
// handshake with nobody told.
func TestDialRacingDeviceCloseReturns(t *testing.T) {
	for i := range rdmacm.Rounds(300, 60) {
		hs := memHosts(t, nil, "10.0.4.1", "10.0.4.2") // nobody listens on the peer: REJ 8
		dev, peer, q := hs[0].dev, hs[1].dev, hs[0].qp(ib.RC)
		require.NoError(t, rdmacm.Enable(dev, nil))
		require.NoError(t, rdmacm.Enable(peer, nil))
		dialed := make(chan error, 1)
		go func() {
			_, err := rdmacm.Dial(context.Background(), q, netip.MustParseAddrPort("10.0.4.2:7471"), nil)
			dialed <- err
		}()
		for range i % 100 {
			runtime.Gosched()
		}
		require.NoError(t, dev.Close())
		err := returnsWithin(t, "Dial racing Device.Close", func() error { return <-dialed })
		// The peer's REJ 8 came first, or the close did: before the REQ
		// left (the device is closed) or after (the connection attempt
		// ends as a destroyed cm_id's does, disconnected).
		var rej *rdmacm.RejectError
		if !errors.As(err, &rej) && !errors.Is(err, ib.ErrDeviceClosed) && !errors.Is(err, rdmacm.ErrDisconnected) {
			t.Fatalf("round %d: Dial racing Device.Close: %v", i, err)
		}
		require.NoError(t, peer.Close())
	}
}
