package rdmacm_test

import (
	"net/netip"
	"testing"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestListenRefusesAForgedHeaderSource: a REQ whose rdma_cm header names
// another source address than the one it came from (its GRH source) is
// refused with REJ 28 and counted (rej_src_mismatch), never queued for
// Accept; a REQ from the same client with its own address is accepted,
// and Request.Remote is that address. IPv4 and IPv6. Bug (the daemon
// audit): Listen took the header's word, so a client could name an
// address an allowlist lets in (Request.Remote) while the REP and the
// connection's traffic came to itself; rxed serve's --allow,
// --max-sessions-per-source and test-connection routing keyed on it.
func TestListenRefusesAForgedHeaderSource(t *testing.T) {
	for _, fam := range []struct{ name, srv, cli, forged string }{
		{"ipv4", "10.13.0.1", "10.13.0.2", "10.13.0.3"},
		{"ipv6", "fd13::1", "fd13::2", "fd13::3"},
	} {
		t.Run(fam.name, func(t *testing.T) {
			hs := memHosts(t, nil, fam.srv, fam.cli)
			srv, cli := hs[0], hs[1]
			ctx := testCtx(t)
			laddr := netip.AddrPortFrom(srv.ip, 7174)
			l, err := rdmacm.Listen(srv.dev, laddr, nil)
			require.NoError(t, err)
			defer l.Close()
			// Accepts the first request queued: a forged one, if the
			// listener let it through (the dialer then gets a REP).
			got := serveOne(ctx, srv, l, nil)

			forged := netip.MustParseAddr(fam.forged)
			ev, err := rdmacm.DialHeader(ctx, cli.qp(ib.RC), laddr, func(h *mad.CMAHeader) { h.Src = forged })
			require.NoError(t, err)
			require.Equal(t, cm.EventREJ, ev.Type, "a REQ from %v whose header names %v was answered with %v", cli.ip, forged, ev.Type)
			require.Equal(t, mad.REJConsumerDefined, ev.Reason)
			require.Equal(t, uint64(1), rdmacm.Counters(srv.dev)["rej_src_mismatch"])

			// The same client with its own address: the first request
			// the listener queued.
			q := cli.qp(ib.RC)
			c, err := rdmacm.Dial(ctx, q, laddr, nil)
			require.NoError(t, err)
			defer func() { _ = c.Disconnect(ctx) }()
			s := <-got
			require.NoError(t, s.err)
			require.Equal(t, cli.ip, s.req.Remote.Addr())
			gid, qpn := s.req.RemoteQP()
			require.Equal(t, cli.ip, gid)
			require.Equal(t, q.Num(), qpn)
			require.Equal(t, uint64(1), rdmacm.Counters(srv.dev)["rej_src_mismatch"], "a genuine request counted")
		})
	}
}

// TestListenUDRefusesAForgedHeaderSource: the same for a UD listener's
// SIDR_REQ (rdma_cm's UDP port space): a forged header source gets a
// SIDR_REP with status REJECT and is counted; the client's genuine
// request is answered by the application. Bug: as
// TestListenRefusesAForgedHeaderSource.
func TestListenUDRefusesAForgedHeaderSource(t *testing.T) {
	hs := memHosts(t, nil, "10.13.1.1", "10.13.1.2")
	srv, cli := hs[0], hs[1]
	ctx := testCtx(t)
	laddr := ap("10.13.1.1:7174")
	l, err := rdmacm.Listen(srv.dev, laddr, &rdmacm.ListenOptions{PortSpace: mad.PortSpaceUDP})
	require.NoError(t, err)
	defer l.Close()
	const qkey = 0x01234567
	uq := srv.qp(ib.UD)
	require.NoError(t, ib.ConnectQP(uq, ib.RemoteQP{}, ib.ConnectAttr{QKey: qkey}))
	remotes := make(chan netip.AddrPort, 2)
	go func() {
		for {
			req, err := l.Accept(ctx)
			if err != nil {
				return
			}
			remotes <- req.Remote
			_ = req.AcceptUD(uq, qkey, nil)
		}
	}()

	r, err := rdmacm.DialUDHeader(ctx, cli.dev, laddr, func(h *mad.CMAHeader) { h.Src = netip.MustParseAddr("10.13.1.3") })
	require.NoError(t, err)
	require.NoError(t, r.Err)
	require.Equal(t, mad.SIDRReject, r.Status)
	require.Equal(t, uint64(1), rdmacm.Counters(srv.dev)["rej_src_mismatch"])

	ud, err := rdmacm.DialUD(ctx, cli.dev, laddr, nil)
	require.NoError(t, err)
	require.Equal(t, uq.Num(), ud.QPN)
	require.Equal(t, cli.ip, (<-remotes).Addr(), "the first request the listener queued")
	require.Equal(t, uint64(1), rdmacm.Counters(srv.dev)["rej_src_mismatch"])
}
