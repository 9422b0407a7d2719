package daemon

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm/cmtest"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// TestRDMACMClientExitsWithoutTimewait: a perftest -R client on rxed's CM
// (rxed perf -R) that disconnects its test connections and then its
// control connection, as perftest's client does, is the active side of
// every DREQ: its DREPs came, nothing can need an answer from it, so its
// device closes at once whatever its linger. Bug (session AJ): the
// session disconnected the control connection as soon as the test
// connections were gone, beating or crossing the client's DREQ, so the
// client answered a DREQ and sat out a timewait (2 s) in its device close
// (rxed perf -R against serve --rdma-cm-port exited 2.07 s late). The
// daemon's grace never runs out here (its ticker never ticks) and the
// client's CM clock never moves, with a linger of an hour: a close that
// waited for a timewait does not return.
func TestRDMACMClientExitsWithoutTimewait(t *testing.T) {
	n := transport.NewMemNetwork()
	srv, cli := netip.MustParseAddr("10.0.8.1"), netip.MustParseAddr("10.0.8.2")
	sc, err := n.Listen(netip.AddrPortFrom(srv, transport.RoCEv2Port))
	require.NoError(t, err)
	logs := newLogWatch()
	never := func(time.Duration) (<-chan time.Time, func()) { return nil, func() {} }
	d, err := New(Config{Addrs: []netip.Addr{srv}, Conn: sc, RDMACMPort: DefaultRDMACMPort, IdleTimeout: -1,
		HandshakeTimeout: 20 * time.Second, Logger: slog.New(logs), Ticker: never,
		Exports: []ExportSpec{{Name: "data", Kind: ExportAnon, Size: 1 << 20}}})
	require.NoError(t, err)
	runDaemon(t, d)

	cc, err := n.Listen(netip.AddrPortFrom(cli, transport.RoCEv2Port))
	require.NoError(t, err)
	dev, err := ib.OpenDevice(ib.Config{Conn: cc, Workers: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dev.Close() })
	clock := cmtest.NewFakeClock(time.Unix(0, 0))
	require.NoError(t, rdmacm.Enable(dev, &rdmacm.Config{Clock: clock, Linger: time.Hour}))
	// Before the close above: a failed test's lingering close ends with
	// the timewait.
	t.Cleanup(func() { clock.Advance(time.Minute) })

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := newCMTestClient(t, dev, netip.AddrPortFrom(srv, DefaultRDMACMPort))
	require.NoError(t, c.connect(ctx))
	_, err = c.ctrl.HandShake(ctx, oob.Key{}, true)
	require.NoError(t, err)
	require.NoError(t, c.dialTestQPs(ctx, 2))
	waiting := logs.logged("rdma_cm session waits for the client to disconnect the control connection")
	require.NoError(t, c.finish(ctx))

	// The client's teardown: its test connections, each answered.
	for _, conn := range c.conns {
		require.NoError(t, conn.Disconnect(ctx))
	}
	ctrl := c.ctrl.Conn()
	select {
	case <-waiting:
	case <-ctrl.Done():
		t.Fatal("the session disconnected the control connection itself, before the client's DREQ: the client answered a DREQ and lingers through its timewait")
	case <-ctx.Done():
		t.Fatal("the session never waited for the client's DREQ on the control connection")
	}
	require.NoError(t, ctrl.Disconnect(ctx))
	require.ErrorIs(t, ctrl.Err(), rdmacm.ErrDisconnected)

	closed := make(chan struct{})
	go func() {
		_ = dev.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("the client's device close waited for its linger: it answered a DREQ of the daemon's (CM counters %v)", rdmacm.Counters(dev))
	}
	logs.waitFor(t, "perftest rdma_cm session complete", 1)
	require.Equal(t, uint64(1), d.completed.Load())
}
