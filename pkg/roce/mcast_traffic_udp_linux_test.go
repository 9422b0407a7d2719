//go:build linux

package roce

import (
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/internal/netns"
	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// TestMcastGRHCarriesTheReceivedTOSAndTTLOverUDP: over real UDP sockets
// (a network namespace of the test's own, loopback with multicast on), a
// multicast datagram's GRH holds the IPv4 TOS and TTL it arrived with,
// as a unicast UD receive's does (TestUDGRHCarriesTheReceivedTOSAndTTL):
// the group's own socket (Membership.Conn, which a Linux socket bound to
// a unicast address needs besides it) reports them while the membership,
// and with it an attached UD QP, exists. Bug (IP TOS/TTL follow-ups,
// item 3): ReportTraffic reached only the engine's Conn, so multicast
// GRHs said TOS 0 and TTL 64 whatever arrived.
func TestMcastGRHCarriesTheReceivedTOSAndTTLOverUDP(t *testing.T) {
	why := netns.Available()
	testenv.Need(t, why == "", "%s", why)
	ns, err := netns.Create(fmt.Sprintf("rxed-rmt-%d", os.Getpid()))
	require.NoError(t, err)
	defer ns.Delete()
	require.NoError(t, ns.LoopbackMulticast())

	addrA, addrB := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	var ca, cb transport.Conn
	require.NoError(t, ns.Do(func() error {
		var err error
		if ca, err = transport.OpenUDP(transport.UDPConfig{Addrs: []netip.Addr{addrA}, Port: transport.RoCEv2Port}); err != nil {
			return err
		}
		cb, err = transport.OpenUDP(transport.UDPConfig{Addrs: []netip.Addr{addrB}, Port: transport.RoCEv2Port})
		return err
	}))
	a := sideOn(t, ca, addrA, qp.UD, sideCap)
	b := sideOn(t, cb, addrB, qp.UD, sideCap)
	udReady(t, a)
	udReady(t, b)
	group := netip.AddrFrom16(destroyTestGroup.As16()) // the GID: IPv4-mapped
	require.NoError(t, ns.Do(func() error { return b.e.AttachMcast(b.q, group) }))

	amr, _ := regMR(t, a, 256)
	bmr, dst := regMR(t, b, 256)
	for i, av := range []qp.AddrVector{
		{DGID: group, TrafficClass: 0x68, HopLimit: 7},
		{DGID: group, TrafficClass: 0x28, HopLimit: 9},
		// The defaults, from a sender that never joined the group: TTL
		// 64, rdma_cm's group hop limit, not the socket's multicast
		// default of 1 (the sender's sockets set IP_MULTICAST_TTL as
		// they open; before, only a join did).
		{DGID: group},
		{DGID: group, HopLimit: 64},
	} {
		_, err := b.e.PostRecv(b.q, []qp.RecvWR{{ID: 9, SGL: []qp.SGE{{Addr: bmr.IOVA(), Length: 256, LKey: bmr.LKey()}}}})
		require.NoError(t, err)
		_, err = a.e.PostSend(a.q, []qp.SendWR{{ID: 1, Opcode: qp.WRSend, Flags: qp.Signaled,
			SGL:       []qp.SGE{{Addr: amr.IOVA(), Length: 100, LKey: amr.LKey()}},
			RemoteQPN: McastQPN, RemoteQKey: 0x1234, AV: av}})
		require.NoError(t, err)
		require.Equal(t, qp.WCSuccess, waitWC(t, a.scq).Status)
		require.Equal(t, qp.WCSuccess, waitWC(t, b.rcq).Status)
		requireGRHTraffic(t, dst, av, i)
	}
}
