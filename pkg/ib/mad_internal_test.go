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

// TestGRHTrafficClass reads the received traffic class out of the GRH a
// GSI receive writes: the IPv6 header's, beside its flow label, or the
// IPv4 header's TOS after the 20 zero bytes (what the CM then makes of
// it is cm.Manager.HandleMADTraffic's). Bug (IPv6 traffic parity, item
// 1, session O): the MAD agent read the GRH's addresses only, so an
// answer built from a received MAD could not take its traffic class.
func TestGRHTrafficClass(t *testing.T) {
	for _, c := range []struct {
		src, dst string
		class    uint8
		flow     uint32
	}{
		{"[fd00::9]:4791", "[fd00::2]:4791", 0x68, 0xABCDE},
		{"[fd00::9]:4791", "[fd00::2]:4791", 0xFF, 0xFFFFF},
		{"[fd00::9]:4791", "[fd00::2]:4791", 0, 0x12345},
		{"10.0.0.9:4791", "10.0.0.2:4791", 0x68, 0},
		{"[::ffff:10.1.2.3]:4791", "[::ffff:10.3.2.1]:4791", 0xb8, 0},
	} {
		fl := wire.Flow{Src: netip.MustParseAddrPort(c.src), Dst: netip.MustParseAddrPort(c.dst)}
		var grh [grhLen]byte
		ip := grh[:]
		if fl.IsIPv4() {
			ip = grh[20:]
		}
		fl.PutIPHeader(ip, 8+300)
		wire.SetIPTraffic(ip, c.class, 7, c.flow)
		_, _, ok := grhAddrs(grh[:])
		require.True(t, ok, c.src)
		require.Equal(t, c.class, grhTrafficClass(grh[:]), "%s class %#x flow %#x", c.src, c.class, c.flow)
	}
}
