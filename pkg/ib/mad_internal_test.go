package ib

import (
	"net/netip"
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// TestGRHAddrs reads the addresses back out of the GRH a UD receive
// writes (wire.Flow.PutIPHeader, rxe's layout), and refuses a GRH that
// is neither layout.
func TestGRHAddrs(t *testing.T) {
	for _, c := range []struct{ src, dst string }{
		{"10.0.0.9:4791", "10.0.0.2:4791"},
		{"[fd00::9]:4791", "[fd00::2]:4791"},
		{"[::ffff:10.1.2.3]:4791", "[::ffff:10.3.2.1]:4791"},
	} {
		fl := wire.Flow{Src: netip.MustParseAddrPort(c.src), Dst: netip.MustParseAddrPort(c.dst)}
		var grh [grhLen]byte
		if fl.IsIPv4() {
			fl.PutIPHeader(grh[20:], 8+300)
		} else {
			fl.PutIPHeader(grh[:], 8+300)
		}
		src, dst, ok := grhAddrs(grh[:])
		require.True(t, ok, c.src)
		require.Equal(t, fl.Src.Addr().Unmap(), src)
		require.Equal(t, fl.Dst.Addr().Unmap(), dst)
	}
	var zero [grhLen]byte
	_, _, ok := grhAddrs(zero[:])
	require.False(t, ok)
}
