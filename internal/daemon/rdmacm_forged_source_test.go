package daemon

import (
	"context"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// forger sends rdma_cm REQs whose header says what the test likes, from
// a device with a CM of its own on QP 1 (no rdma_cm agent, whose Dial
// always names the address it sends from).
type forger struct {
	t    *testing.T
	dev  *ib.Device
	m    *cm.Manager
	next uint32 // the next REQ's QPN: a new one each, or the CM takes it for a stale connection
}

func newForger(t *testing.T, addr string) *forger {
	t.Helper()
	dev, err := ib.OpenDevice(ib.Config{Addrs: addrs(t, addr)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dev.Close() })
	var agent atomic.Pointer[ib.MADAgent]
	m := cm.New(cm.Config{NodeGUID: 0x02_0000_0000_0f0f,
		Send: func(dst, src netip.Addr, _ cm.Traffic, b []byte) error { return agent.Load().Send(src, dst, b) }})
	t.Cleanup(m.Close)
	a, err := ib.OpenMADAgent(dev, ib.MADAgentConfig{Handler: m.HandleMAD})
	require.NoError(t, err)
	agent.Store(a)
	t.Cleanup(func() { _ = a.Close() })
	return &forger{t: t, dev: dev, m: m, next: 0x100}
}

// req sends an RC REQ to server whose rdma_cm header names src as its
// source, and returns the answer: a REJ, or a REP (refused at once).
func (f *forger) req(ctx context.Context, server netip.AddrPort, src netip.Addr) cm.Event {
	f.t.Helper()
	gid := f.dev.GIDs()[0].Unmap()
	hdr := mad.CMAHeader{IPVersion: 4, SrcPort: 40000, Src: src, Dst: server.Addr()}
	answers := make(chan cm.Event, 1)
	f.next++
	id, err := f.m.Connect(cm.ConnectParams{Src: gid, Dst: server.Addr(), ServiceID: mad.ServiceID(mad.PortSpaceTCP, server.Port()),
		QPN: f.next, StartingPSN: 1, PathMTU: uint8(ib.MTU1024), PacketLifeTime: 18, RetryCount: 7, RNRRetryCount: 7,
		PrivateData: hdr.Append(nil)}, func(ev cm.Event) {
		switch ev.Type {
		case cm.EventREP:
			_ = ev.ID.Reject(mad.REJConsumerDefined, nil, nil)
		case cm.EventREJ, cm.EventTimeout:
		default:
			return
		}
		select {
		case answers <- ev:
		default:
		}
	})
	require.NoError(f.t, err)
	select {
	case ev := <-answers:
		return ev
	case <-ctx.Done():
		id.Destroy()
		f.t.Fatalf("no answer to the forged REQ: %v", ctx.Err())
		return cm.Event{}
	}
}

// TestRDMACMForgedHeaderSourceGetsNoSession: with --allow naming one
// address, a host at another whose REQs' rdma_cm header names the allowed
// address is refused (REJ 28) and gets neither a session nor a test
// connection of the allowed client's session, and that client's own
// session is unharmed. Bug (the daemon audit): the accept loop took the
// peer from the header (Request.Remote), which the client writes, while
// the REP and the traffic go to the REQ's GRH source: the forger got a
// session (the allowlist and --max-sessions-per-source looked at the
// named address), or, in the window where the allowed client's session
// waited for its test connections, was taken for one of them.
func TestRDMACMForgedHeaderSourceGetsNoSession(t *testing.T) {
	logs := newLogWatch()
	d, err := New(Config{Addrs: addrs(t, "127.0.3.236"), RDMACMPort: DefaultRDMACMPort, IdleTimeout: -1,
		HandshakeTimeout: 20 * time.Second, Logger: slog.New(logs),
		Allow:   []netip.Prefix{netip.MustParsePrefix("127.0.3.237/32")},
		Exports: []ExportSpec{{Name: "data", Kind: ExportAnon, Size: 1 << 20}}})
	require.NoError(t, err)
	runDaemon(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	server := netip.AddrPortFrom(netip.MustParseAddr("127.0.3.236"), DefaultRDMACMPort)
	allowed := netip.MustParseAddr("127.0.3.237")
	f := newForger(t, "127.0.3.238")

	ev := f.req(ctx, server, allowed)
	require.Equal(t, cm.EventREJ, ev.Type, "a REQ from 127.0.3.238 naming %v was answered with %v", allowed, ev.Type)
	require.Equal(t, mad.REJConsumerDefined, ev.Reason)
	require.Zero(t, d.total.Load(), "sessions started")

	// The allowed client, its session waiting for its test connections.
	dev, err := ib.OpenDevice(ib.Config{Addrs: []netip.Addr{allowed}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dev.Close() })
	require.NoError(t, rdmacm.Enable(dev, nil))
	c := newCMTestClient(t, dev, server)
	require.NoError(t, c.connect(ctx))
	_, err = c.ctrl.HandShake(ctx, oob.Key{}, true)
	require.NoError(t, err)

	ev = f.req(ctx, server, allowed)
	require.Equal(t, cm.EventREJ, ev.Type, "a REQ from 127.0.3.238 naming %v in its session's window was answered with %v", allowed, ev.Type)
	require.Equal(t, mad.REJConsumerDefined, ev.Reason)

	require.NoError(t, c.dialTestQPs(ctx, 1))
	require.NoError(t, c.finish(ctx))
	logs.waitFor(t, "perftest rdma_cm session complete", 1)
	require.Equal(t, uint64(1), d.total.Load())
	require.Zero(t, d.failed.Load())
}
