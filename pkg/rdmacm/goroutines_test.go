package rdmacm_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
)

// TestDeviceCloseLeavesNoGoroutine: two devices on loopback UDP sockets,
// a listener, a connection that carried a SEND (a CQ notification
// handler and a QP event handler installed), then the devices closed
// with the connection up: no goroutine of the stack is left (the
// engines', the MAD agents', the CM's timers, the handler runners). A
// guard written by the goroutine audit (session AG): an embedder's
// goleak-style check must pass once Device.Close has returned.
func TestDeviceCloseLeavesNoGoroutine(t *testing.T) {
	leaks := testenv.SnapshotGoroutines(testenv.StackPackages()...)
	hs := udpHosts(t, "127.0.5.41", "127.0.5.42")
	srv, cli := hs[0], hs[1]
	ctx := testCtx(t)
	for _, h := range hs {
		require.NoError(t, rdmacm.Enable(h.dev, nil))
	}
	laddr := netip.AddrPortFrom(srv.ip, 7174)
	l, err := rdmacm.Listen(srv.dev, laddr, nil)
	require.NoError(t, err)
	got := serveOne(ctx, srv, l, nil)
	notified := make(chan struct{}, 1)
	require.NoError(t, srv.cq.SetNotifyHandler(func(*ib.CQ) {
		select {
		case notified <- struct{}{}:
		default:
		}
	}))
	require.NoError(t, srv.cq.ReqNotify(false))
	q := cli.qp(ib.RC)
	q.OnEvent(func(ib.AsyncEvent) {})
	c, err := rdmacm.Dial(ctx, q, laddr, nil)
	require.NoError(t, err)
	s := <-got
	require.NoError(t, s.err)
	require.NoError(t, q.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRSend, SGL: []ib.SGE{cli.sge(0, 64)}, Flags: ib.SendSignaled}))
	require.Equal(t, ib.WCSuccess, cli.wc(ctx).Status)
	require.Equal(t, ib.WCSuccess, srv.wc(ctx).Status)
	<-notified
	_ = c

	require.NoError(t, l.Close())
	for _, h := range hs {
		require.NoError(t, h.dev.Close())
	}
	leaks.CheckNoneLeft(t)
}
