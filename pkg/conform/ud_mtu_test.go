package conform

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// D-UD-OVER-MTU sends 256 bytes over the peer's UD MTU, which is its
// port's active MTU (derived from the link), not the tool's -m: against
// rxed over loopback (port MTU 4096) a 1280-byte datagram was a valid one
// and ended the pingpong server's QP with a local length error, which the
// scenario took for a peer that stopped serving.
func TestActiveMTUFromLink(t *testing.T) {
	for _, c := range []struct {
		link int
		v6   bool
		want int
	}{
		{65536, false, 4096}, // loopback
		{9000, true, 4096},   // jumbo frames
		{1500, false, 1024},  // Ethernet: rxe's active MTU there
		{1500, true, 1024},
		{1100, false, 1024}, // 1024 + 52 bytes of headers fit
		{1075, false, 512},
		{1095, true, 512}, // IPv6's 20 more bytes
		{100, false, 256},
	} {
		require.Equal(t, c.want, activeMTU(c.link, c.v6), "link %d ipv6 %v", c.link, c.v6)
	}
	require.Equal(t, 4096, udPortMTU(netip.MustParseAddr("127.0.0.1"), 1024), "loopback's MTU is 65536")
	require.Equal(t, 777, udPortMTU(netip.MustParseAddr("192.0.2.77"), 777), "no such interface: the fallback")
}
