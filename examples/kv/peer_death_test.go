package kv

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// A server whose host dies (its link stops sending: no DREQ, no READ
// response, no ACK) while clients GET and PUT: every client's call fails
// with ErrConnLost well within the bound of its QP's retries (ACK
// timeout 67 ms, 7 retries: about half a second), none hangs, and the
// server (its device still open) closes.
func TestRDMAServerHostDiesUnderClients(t *testing.T) {
	tab, err := NewTable(testTable)
	require.NoError(t, err)
	n := transport.NewMemNetwork()
	sc, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), transport.RoCEv2Port))
	require.NoError(t, err)
	cut := &cutConn{Conn: sc}
	srvDev, err := ib.OpenDevice(ib.Config{Conn: cut})
	require.NoError(t, err)
	app := NewApp(tab)
	cmAddr := netip.MustParseAddrPort("10.0.0.1:7471")
	srv, err := ServeRDMA(app, srvDev, cmAddr, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = srvDev.Close()
		_ = tab.Close()
	})
	cliDev := openDev(t, n, "10.0.0.2")

	const nc = 3
	var ops atomic.Int64
	errs := make(chan error, nc)
	for ci := range nc {
		c, err := DialRDMA(ctxT(t), cliDev, cmAddr, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		go func() {
			ctx := context.Background()
			key := fmt.Appendf(nil, "client-%d", ci)
			val := bytes.Repeat([]byte{byte(ci)}, 300)
			for {
				err := c.Put(ctx, key, val)
				if err == nil {
					_, err = c.Get(ctx, key)
				}
				if err != nil {
					errs <- err
					return
				}
				ops.Add(1)
			}
		}()
	}
	require.Eventually(t, func() bool { return ops.Load() >= 3*nc }, 20*time.Second, time.Millisecond, "the clients run")
	cut.mode.Store(cutAll)
	died := time.Now()
	for range nc {
		select {
		case err := <-errs:
			t.Logf("%v after the death: %v", time.Since(died).Round(time.Millisecond), err)
			require.ErrorIs(t, err, ErrConnLost)
			require.ErrorContains(t, err, "connection to 10.0.0.1:7471 lost")
		case <-time.After(20 * time.Second):
			t.Fatal("a client's call hangs on a dead server")
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- srv.Close() }()
	select {
	case <-closed:
		t.Logf("the server closed %v after the death", time.Since(died).Round(time.Millisecond))
	case <-time.After(20 * time.Second):
		t.Fatal("the server's Close hangs with its link dead")
	}
}

// midSendCut is a client host's link that dies after the first packet of
// a multi-packet SEND: the client was killed mid-PUT.
type midSendCut struct {
	transport.Conn
	dead atomic.Bool
}

func (c *midSendCut) Send(bufs [][]byte, ep transport.Endpoint) error {
	if c.dead.Load() {
		return nil
	}
	for i, b := range bufs {
		if len(b) > 0 && wire.Opcode(b[0]) == wire.RCSendFirst {
			c.dead.Store(true)
			return c.Conn.Send(bufs[:i+1], ep) // the PUT's first packet, then nothing
		}
	}
	return c.Conn.Send(bufs, ep)
}

// A client killed in the middle of a PUT whose SEND spans several packets
// (a 12000-byte value, three packets at MTU 4096): the server applies a request only once its whole
// SEND arrived, so the half that did is never seen: other clients' READs
// go on returning the old value byte for byte, the table is unchanged,
// and the dead client's connection is freed by the keepalive.
func TestRDMAClientKilledMidPUTLeavesTheValue(t *testing.T) {
	tab, err := NewTable(TableConfig{NBuckets: 64, ExtentSize: 16384})
	require.NoError(t, err)
	n := transport.NewMemNetwork()
	srvDev := openDev(t, n, "10.0.0.1")
	app := NewApp(tab)
	cmAddr := netip.MustParseAddrPort("10.0.0.1:7471")
	srv, err := ServeRDMA(app, srvDev, cmAddr, &RDMAServerConfig{KeepAlive: 20 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = srv.Close()
		_ = srvDev.Close()
		_ = tab.Close()
	})
	reader, err := DialRDMA(ctxT(t), openDev(t, n, "10.0.0.2"), cmAddr, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reader.Close() })
	vc, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr("10.0.0.3"), transport.RoCEv2Port))
	require.NoError(t, err)
	cut := &midSendCut{Conn: vc}
	vdev, err := ib.OpenDevice(ib.Config{Conn: cut})
	require.NoError(t, err)
	t.Cleanup(func() { _ = vdev.Close() })
	victim, err := DialRDMA(ctxT(t), vdev, cmAddr, &RDMAClientConfig{ACKTimeout: 10})
	require.NoError(t, err)
	t.Cleanup(func() { _ = victim.Close() })

	ctx := ctxT(t)
	key := []byte("k")
	old := bytes.Repeat([]byte("o"), 12000)
	require.NoError(t, reader.Put(ctx, key, old))
	require.Equal(t, 2, srv.Conns())
	err = victim.Put(ctx, key, bytes.Repeat([]byte("n"), 12000))
	require.ErrorIs(t, err, ErrConnLost, "the killed client's PUT")
	require.True(t, cut.dead.Load())

	for range 20 {
		v, err := reader.Get(ctx, key)
		require.NoError(t, err)
		require.Equal(t, old, v, "a half-sent PUT is never visible")
	}
	local, err := tab.Get(key)
	require.NoError(t, err)
	require.Equal(t, old, local)
	rs, _ := app.Stats()
	require.Equal(t, uint64(1), rs.Puts, "the half-sent PUT never reached the handler")
	require.Eventually(t, func() bool { return srv.Conns() == 1 }, 20*time.Second, time.Millisecond, "the dead client's connection is freed")
}

// A server whose host dies after its QP acknowledged a PUT's SEND and
// before its handler's response left: the client's SEND completed, and
// its QP, with nothing unacknowledged, retries nothing, so only a probe
// tells it the server is gone. The PUT fails with ErrConnLost about a
// probe interval plus the QP's retries (67 ms + 8 x 67 ms) after it
// began. (CI, session AH: the third of TestRDMAServerHostDiesUnderClients's
// clients waited on its receive for ever, the test's 20 s bound.)
func TestRDMAServerDiesBetweenACKAndResponse(t *testing.T) {
	cut := &cutConn{}
	c := clientOfServerOn(t, func(sc transport.Conn) transport.Conn { cut.Conn = sc; return cut })
	require.NoError(t, c.Put(ctxT(t), []byte("k"), []byte("before")))

	cut.mode.Store(cutAfterACK)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	began := time.Now()
	err := c.Put(ctx, []byte("k"), []byte("after"))
	t.Logf("the PUT failed %v after it began: %v", time.Since(began).Round(time.Millisecond), err)
	require.Equal(t, cutAll, cut.mode.Load(), "the server acknowledged the SEND, then died")
	require.ErrorIs(t, err, ErrConnLost)
	require.ErrorContains(t, err, "RETRY_EXC_ERR")
	require.NoError(t, ctx.Err(), "the PUT waited for the test's bound")
	_, err = c.Get(ctxT(t), []byte("k"))
	require.ErrorIs(t, err, ErrConnLost, "the client knows its connection is gone")
}

// dropSends is a server host's link that loses its next drop RC SENDs
// (its responses) and nothing else: its QP retransmits them after its
// ACK timeout.
type dropSends struct {
	transport.Conn
	drop atomic.Int32
}

func (c *dropSends) Send(bufs [][]byte, ep transport.Endpoint) error {
	kept := bufs[:0:0]
	for _, b := range bufs {
		if len(b) > 0 && wire.Opcode(b[0]) == wire.RCSendOnly && c.drop.Add(-1) >= 0 {
			continue
		}
		kept = append(kept, b)
	}
	if len(kept) == 0 {
		return nil
	}
	return c.Conn.Send(kept, ep)
}

// A response that is late but comes (the server's QP lost it twice and
// retransmits it after its 67 ms ACK timeout each time) keeps the call
// waiting: the client probes the server, whose QP acknowledges the probe,
// and the PUT succeeds with the value stored.
func TestRDMAClientProbesALateResponseAndWaits(t *testing.T) {
	lossy := &dropSends{}
	c := clientOfServerOn(t, func(sc transport.Conn) transport.Conn { lossy.Conn = sc; return lossy })

	lossy.drop.Store(2)
	require.NoError(t, c.Put(ctxT(t), []byte("k"), []byte("late")))
	require.Negative(t, lossy.drop.Load(), "both responses were lost")
	require.GreaterOrEqual(t, c.Stats().Probes, uint64(1), "the client probed while the response was late")
	got, err := c.Get(ctxT(t), []byte("k"))
	require.NoError(t, err)
	require.Equal(t, "late", string(got))
	require.NoError(t, c.Put(ctxT(t), []byte("k"), []byte("on time")))
}

// clientOfServerOn serves testTable on 10.0.0.1:7471 (keepalives off)
// over the link link makes of the server's socket, and returns a client
// connected from 10.0.0.2.
func clientOfServerOn(t *testing.T, link func(transport.Conn) transport.Conn) *RDMAClient {
	t.Helper()
	tab, err := NewTable(testTable)
	require.NoError(t, err)
	n := transport.NewMemNetwork()
	sc, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), transport.RoCEv2Port))
	require.NoError(t, err)
	srvDev, err := ib.OpenDevice(ib.Config{Conn: link(sc)})
	require.NoError(t, err)
	cmAddr := netip.MustParseAddrPort("10.0.0.1:7471")
	srv, err := ServeRDMA(NewApp(tab), srvDev, cmAddr, &RDMAServerConfig{KeepAlive: -1})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = srv.Close()
		_ = srvDev.Close()
		_ = tab.Close()
	})
	c, err := DialRDMA(ctxT(t), openDev(t, n, "10.0.0.2"), cmAddr, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}
