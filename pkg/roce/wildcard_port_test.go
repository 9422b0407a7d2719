package roce

import (
	"net/netip"
	"testing"

	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// TestWildcardSocketServesItsFamilysGIDs: a GID with no socket of its
// own is served by the wildcard-bound socket of its family, whose port its
// packets carry (the ICRC covers the UDP source port) and Port reports; a
// GID of a family with no wildcard socket has no port.
//
// Bug (link-local from a socket bound to ::, lead's task list): such a
// GID had port 0, so the engine sealed its packets for UDP source port 0
// and the peer's ICRC check failed (TestLinkLocalIPv6WildcardInNetns in
// pkg/ib).
func TestWildcardSocketServesItsFamilysGIDs(t *testing.T) {
	mc, err := transport.NewMemNetwork().Listen(netip.MustParseAddrPort("[fd00::9]:4791"))
	require.NoError(t, err)
	c := wildConn{Conn: mc}
	gids := []netip.Addr{netip.MustParseAddr("fe80::b"), netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("10.0.0.1")}
	e, err := New(Config{Conn: c, GIDs: gids, Workers: 1})
	require.NoError(t, err)
	defer e.Close()
	for i, want := range []uint16{4791, 4791, 0} {
		require.Equal(t, want, e.Port(gids[i]), "%v", gids[i])
		require.Equal(t, netip.AddrPortFrom(gids[i], want), e.gidEndpoint(uint8(i)))
	}
	require.Equal(t, uint16(4791), e.Port(netip.MustParseAddr("fe80::b%eth0")), "the zone is ignored")
}

// wildConn is a Conn that says it is bound to [::]:4791 (MemNetwork has
// no wildcard).
type wildConn struct{ transport.Conn }

func (wildConn) LocalAddrs() []netip.AddrPort {
	return []netip.AddrPort{netip.MustParseAddrPort("[::]:4791")}
}
