package rdmacm_test

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// deafness drops every datagram a device receives once deaf is set.
type deafness struct{ deaf atomic.Bool }

func (d *deafness) FilterRx(b transport.RxBatch) int {
	if !d.deaf.Load() {
		return b.Len()
	}
	return b.Partition(func([]byte) bool { return false })
}

// TestConcurrentDisconnectsWaitForTheDREP: two goroutines disconnecting
// one connection both wait for the answer to the DREQ, as Disconnect
// says; a peer that never answers leaves both waiting until their
// contexts end. Bug (found by an audit, session AE): the second
// Disconnect sent a DREQ of its own, which the CM refused (DREQ_SENT is
// not ESTABLISHED), took that for the peer's crossing DREQ and ended the
// connection, so both returned at once with nil.
func TestConcurrentDisconnectsWaitForTheDREP(t *testing.T) {
	net := transport.NewMemNetwork()
	var deaf deafness
	open := func(addr string, wrap func(transport.Conn) (transport.Conn, error)) *host {
		c, err := net.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), transport.RoCEv2Port))
		require.NoError(t, err)
		return openHost(t, ib.Config{Conn: c, Wrap: wrap}, netip.MustParseAddr(addr))
	}
	srv := open("10.6.0.1", func(c transport.Conn) (transport.Conn, error) {
		return transport.NewRxFilterConn(c, &deaf), nil
	})
	cli := open("10.6.0.2", nil)
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.6.0.1:7471"), nil)
	require.NoError(t, err)
	defer l.Close()
	got := serveOne(ctx, srv, l, nil)
	c, err := rdmacm.Dial(ctx, cli.qp(ib.RC), ap("10.6.0.1:7471"), nil)
	require.NoError(t, err)
	require.NoError(t, (<-got).err)

	deaf.deaf.Store(true) // the server hears no DREQ: no DREP comes
	// The wait is what is tested: both calls must still be waiting when
	// their contexts end, well before the CM gives up on the DREQ.
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- c.Disconnect(dctx) }()
	}
	for range 2 {
		require.ErrorIs(t, <-errs, context.DeadlineExceeded, "a Disconnect returned before any DREP")
	}
	select {
	case <-c.Done():
		t.Fatal("the connection ended without an answer to its DREQ")
	default:
	}
}
