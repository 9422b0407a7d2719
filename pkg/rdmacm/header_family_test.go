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

// mapped is a's IPv4-mapped IPv6 form, ::ffff:a.b.c.d.
func mapped(a string) netip.Addr { return netip.AddrFrom16(netip.MustParseAddr(a).As16()) }

// TestListenHeaderFamilies: what a listener does with an rdma_cm header
// whose IP version or addresses are not the plain form of the GRH's
// family, above all a version 6 header naming IPv4-mapped addresses
// (::ffff:a.b.c.d), row by row as drivers/infiniband/core/cma.c (6.1)
// answers it; the kernel function each row follows is in its name. The
// kernel never compares the header with the GRH: it keeps a version 6
// header's 16 bytes as they are (cma_save_ip6_info), picks the listener
// by the header's version and destination (cma_match_private_data: an
// AF_INET listener takes version 4 only, an AF_INET6 one version 6, ::
// both), and then needs the header's destination to be a GID of the port
// (cma_ib_acquire_dev -> cma_validate_port); a handler failure is REJ 28
// (consumer defined; a SIDR_REQ: SIDR_REP REJECT). validate_net_dev's
// route lookup has no counterpart here: rxed refuses instead a header
// whose source is not the GRH's (fromHeaderSource, rej_src_mismatch),
// stricter than the kernel, which accepts row "IPv6 GRH, mapped source"
// on a host whose IPv6 routes cover ::ffff:0:0/96 (an IPv6 default route
// through the interface) and refuses it on one without.
//
// Bug (portability task, item 2): a version 6 header naming a mapped
// destination was refused whatever listened (REJ 28), where the kernel's
// :: listener takes it; and a wildcard listener took a header naming a
// destination that is none of the device's GIDs (Request.Local an
// address the device does not have), where cma_ib_acquire_dev refuses it.
func TestListenHeaderFamilies(t *testing.T) {
	const port = 7174
	v6mapped := func(src, dst string) func(*mad.CMAHeader) {
		return func(h *mad.CMAHeader) { h.IPVersion, h.Src, h.Dst = 6, mapped(src), mapped(dst) }
	}
	for _, tc := range []struct {
		name     string
		srv, cli string // the GRH's addresses
		listen   string // the listener's address
		ud       bool   // a SIDR_REQ to a UDP port space listener
		edit     func(*mad.CMAHeader)
		accept   bool   // Accept gets the request, with these addresses:
		local    string // Request.Local's (unmapped)
		remote   string // Request.Remote's
		srcCheck bool   // refused by fromHeaderSource (rej_src_mismatch)
	}{
		{name: "IPv4 GRH, version 6 header all mapped, :: listener (cma_match_private_data: :: takes version 6; cma_save_ip6_info; cma_ib_acquire_dev finds ::ffff:srv)",
			srv: "10.15.0.1", cli: "10.15.0.2", listen: "::", edit: v6mapped("10.15.0.2", "10.15.0.1"),
			accept: true, local: "10.15.0.1", remote: "10.15.0.2"},
		{name: "IPv4 GRH, version 6 header all mapped, 0.0.0.0 listener (cma_match_private_data: an AF_INET listener takes version 4 only)",
			srv: "10.15.0.1", cli: "10.15.0.2", listen: "0.0.0.0", edit: v6mapped("10.15.0.2", "10.15.0.1")},
		{name: "IPv4 GRH, version 6 header all mapped, listener on the IPv4 address (cma_match_private_data: version 4 only)",
			srv: "10.15.0.1", cli: "10.15.0.2", listen: "10.15.0.1", edit: v6mapped("10.15.0.2", "10.15.0.1")},
		{name: "IPv4 GRH, version 6 header, mapped destination no GID, :: listener (cma_ib_acquire_dev: cma_validate_port finds no GID)",
			srv: "10.15.0.1", cli: "10.15.0.2", listen: "::", edit: v6mapped("10.15.0.2", "10.15.0.9")},
		{name: "IPv4 GRH, version 6 header, mapped source not the GRH's, :: listener (rxed's fromHeaderSource for validate_net_dev)",
			srv: "10.15.0.1", cli: "10.15.0.2", listen: "::", edit: v6mapped("10.15.0.3", "10.15.0.1"), srcCheck: true},
		{name: "IPv4 GRH, version 4 header, :: listener (cma_match_private_data: :: takes version 4, afonly 0)",
			srv: "10.15.0.1", cli: "10.15.0.2", listen: "::", edit: func(*mad.CMAHeader) {},
			accept: true, local: "10.15.0.1", remote: "10.15.0.2"},
		{name: "IPv4 GRH, version 4 header, destination no GID, 0.0.0.0 listener (cma_ib_acquire_dev: cma_validate_port finds no GID)",
			srv: "10.15.0.1", cli: "10.15.0.2", listen: "0.0.0.0", edit: func(h *mad.CMAHeader) { h.Dst = netip.MustParseAddr("10.15.0.9") }},
		{name: "IPv6 GRH, version 6 header all mapped, :: listener (rxed's fromHeaderSource for validate_ipv6_net_dev's route lookup)",
			srv: "fd15::1", cli: "fd15::2", listen: "::", edit: v6mapped("10.15.0.2", "10.15.0.1"), srcCheck: true},
		{name: "IPv6 GRH, version 6 header, mapped destination of an IPv6-only device, :: listener (cma_ib_acquire_dev: no GID ::ffff:a.b.c.d)",
			srv: "fd15::1", cli: "fd15::2", listen: "::", edit: func(h *mad.CMAHeader) { h.Dst = mapped("10.15.0.1") }},
		{name: "IPv6 GRH, version 6 header, 0.0.0.0 listener (cma_match_private_data: version 4 only)",
			srv: "fd15::1", cli: "fd15::2", listen: "0.0.0.0", edit: func(*mad.CMAHeader) {}},
		{name: "UD, IPv4 GRH, version 6 header all mapped, :: listener (cma_match_private_data, cma_ib_new_udp_id)",
			srv: "10.15.0.1", cli: "10.15.0.2", listen: "::", ud: true, edit: v6mapped("10.15.0.2", "10.15.0.1"),
			accept: true, local: "10.15.0.1", remote: "10.15.0.2"},
		{name: "UD, IPv4 GRH, version 6 header all mapped, 0.0.0.0 listener (cma_match_private_data: version 4 only)",
			srv: "10.15.0.1", cli: "10.15.0.2", listen: "0.0.0.0", ud: true, edit: v6mapped("10.15.0.2", "10.15.0.1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := memHosts(t, nil, tc.srv, tc.cli)
			srv, cli := hs[0], hs[1]
			ctx := testCtx(t)
			opts := &rdmacm.ListenOptions{}
			if tc.ud {
				opts.PortSpace = mad.PortSpaceUDP
			}
			l, err := rdmacm.Listen(srv.dev, netip.AddrPortFrom(netip.MustParseAddr(tc.listen), port), opts)
			require.NoError(t, err)
			defer l.Close()
			const qkey = 0x01234567
			uq := srv.qp(ib.UD)
			require.NoError(t, ib.ConnectQP(uq, ib.RemoteQP{}, ib.ConnectAttr{QKey: qkey}))
			// Whatever the listener queues is taken and answered (a REJ,
			// or a UD request's SIDR_REP), after it is handed over here:
			// by the time the dialer has its answer, got holds it.
			got := make(chan *rdmacm.Request, 1)
			go func() {
				r, err := l.Accept(ctx)
				if err != nil {
					return
				}
				got <- r
				if r.UD() {
					_ = r.AcceptUD(uq, qkey, nil)
				} else {
					_ = r.Reject(nil)
				}
			}()

			laddr := netip.AddrPortFrom(srv.ip, port)
			if tc.ud {
				res, err := rdmacm.DialUDHeader(ctx, cli.dev, laddr, tc.edit)
				require.NoError(t, err)
				require.NoError(t, res.Err)
				if tc.accept {
					require.Equal(t, mad.SIDRStatus(0), res.Status)
					require.Equal(t, uq.Num(), res.QPN)
				} else {
					require.Equal(t, mad.SIDRReject, res.Status)
				}
			} else {
				ev, err := rdmacm.DialHeader(ctx, cli.qp(ib.RC), laddr, tc.edit)
				require.NoError(t, err)
				require.Equal(t, cm.EventREJ, ev.Type)
				require.Equal(t, mad.REJConsumerDefined, ev.Reason)
			}
			var r *rdmacm.Request
			select {
			case r = <-got:
			default:
			}
			if !tc.accept {
				require.Nil(t, r, "a refused request reached Accept")
				require.Zero(t, rdmacm.Queued(l), "a refused request was queued")
			} else {
				require.NotNil(t, r, "the request never reached Accept")
				require.Equal(t, netip.AddrPortFrom(netip.MustParseAddr(tc.local), port), r.Local)
				require.Equal(t, netip.MustParseAddr(tc.remote), r.Remote.Addr())
				gid, _ := r.RemoteQP()
				require.Equal(t, cli.ip, gid)
			}
			want := uint64(0)
			if tc.srcCheck {
				want = 1
			}
			require.Equal(t, want, rdmacm.Counters(srv.dev)["rej_src_mismatch"])
		})
	}
}
