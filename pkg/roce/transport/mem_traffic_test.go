package transport

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMemNetworkReportsTrafficWhenAsked: a MemNetwork Conn delivers the
// sender's TOS and TTL (TrafficClass, HopLimit; 0 sends the socket's TTL
// 64) while it reports traffic (ReportTraffic counts users, as udpConn's
// IP_RECVTOS / IP_RECVTTL), to unicast and group members alike, and 0 and
// 0 otherwise, so that a receiver's UD GRH can be checked over it. Bug
// (IP TOS/TTL follow-ups, item 2): the in-memory network delivered
// Endpoint{Local, Remote} only, whatever the sender said.
func TestMemNetworkReportsTrafficWhenAsked(t *testing.T) {
	mn := NewMemNetwork()
	a, err := mn.Listen(ap("10.0.0.1:4791"))
	require.NoError(t, err)
	b, err := mn.Listen(ap("10.0.0.2:4791"))
	require.NoError(t, err)
	defer a.Close()
	defer b.Close()
	group := netip.MustParseAddr("239.1.2.3")
	m, err := JoinGroup(b, group)
	require.NoError(t, err)
	defer m.Leave()

	// recv sends one datagram with (tc, hops) to to and returns the
	// traffic b received it with.
	recv := func(to netip.AddrPort, tc, hops uint8) [2]uint8 {
		t.Helper()
		require.NoError(t, a.Send([][]byte{payload(1, 64)}, Endpoint{Remote: to, TrafficClass: tc, HopLimit: hops}))
		got := receiveN(t, b, 1, 256)
		return [2]uint8{got[0].ep.TrafficClass, got[0].ep.HopLimit}
	}
	unicast, toGroup := ap("10.0.0.2:4791"), netip.AddrPortFrom(group, 4791)
	r := b.(TrafficReporter)
	require.Equal(t, [2]uint8{0, 0}, recv(unicast, 0x68, 7), "not reporting")
	require.NoError(t, r.ReportTraffic(true))
	require.NoError(t, r.ReportTraffic(true))
	for _, to := range []netip.AddrPort{unicast, toGroup} {
		require.Equal(t, [2]uint8{0x68, 7}, recv(to, 0x68, 7), "to %v", to)
		require.Equal(t, [2]uint8{0, DefaultHopLimit}, recv(to, 0, 0), "to %v: the defaults", to)
	}
	require.NoError(t, r.ReportTraffic(false))
	require.Equal(t, [2]uint8{0x28, 9}, recv(unicast, 0x28, 9), "one user left")
	require.NoError(t, r.ReportTraffic(false))
	require.NoError(t, r.ReportTraffic(false), "one too many is no error")
	require.Equal(t, [2]uint8{0, 0}, recv(toGroup, 0x68, 7), "no user left")
	require.NoError(t, r.ReportTraffic(true))
	require.Equal(t, [2]uint8{0x68, 7}, recv(unicast, 0x68, 7), "counted from 0 again")
}
