package wire

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSetIPTraffic: the per-packet fields land where IPv4 and IPv6 keep
// them, the IPv4 checksum stays valid, a hop limit of 0 keeps 64, and
// the ICRC (which masks them all) does not change.
func TestSetIPTraffic(t *testing.T) {
	for _, tc := range []struct {
		name, src, dst string
		class, hops    uint8
		flow           uint32
		want           map[int]byte // header offset -> byte
	}{
		{"IPv4", "10.0.0.1:1", "10.0.0.2:4791", 0x68, 7, 0, map[int]byte{1: 0x68, 8: 7}},
		{"IPv4 hop limit 0 is 64", "10.0.0.1:1", "10.0.0.2:4791", 0xb8, 0, 0, map[int]byte{1: 0xb8, 8: 64}},
		{"IPv6", "[fd00::1]:1", "[fd00::2]:4791", 0x68, 7, 0xabcde,
			map[int]byte{0: 0x66, 1: 0x8a, 2: 0xbc, 3: 0xde, 7: 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fl := Flow{Src: netip.MustParseAddrPort(tc.src), Dst: netip.MustParseAddrPort(tc.dst)}
			var b [48]byte
			n := fl.PutHeaders(b[:], 0)
			pkt := make([]byte, 12+4)
			pkt[0] = byte(UDSendOnly)
			before := ICRC(b[:n], b[n:n+8], pkt[:12])
			SetIPTraffic(b[:], tc.class, tc.hops, tc.flow)
			for off, v := range tc.want {
				require.Equal(t, v, b[off], "byte %d", off)
			}
			if n == 20 {
				require.Zero(t, IPv4Checksum(b[:20]))
			}
			require.Equal(t, before, ICRC(b[:n], b[n:n+8], pkt[:12]), "the ICRC masks them")
		})
	}
}
