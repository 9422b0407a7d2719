package oob

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCHexAlt(t *testing.T) {
	tests := []struct {
		v     uint64
		width int
		want  string
	}{
		{0, 4, "0000"}, // glibc: no prefix for zero
		{0, 6, "000000"},
		{0x1f, 6, "0x001f"},
		{0xac2de, 6, "0xac2de"},
		{0xaca162, 6, "0xaca162"},
		{0x80, 4, "0x80"},
		{0x1, 4, "0x01"},
		{0xc08, 8, "0x000c08"},
		{0x55ef4ebd2000, 16, "0x0055ef4ebd2000"},
		{0xffffffffffffffff, 16, "0xffffffffffffffff"},
		{0x1234567, 6, "0x1234567"},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, cHexAlt(tc.v, tc.width), "%#x width %d", tc.v, tc.width)
	}
}

func TestCFloat(t *testing.T) {
	require.Equal(t, "4.73   ", cFloat(4.7272, 7, 2, true))
	require.Equal(t, "104.31 ", cFloat(104.3149, 7, 2, true))
	require.Equal(t, "1519.99", cFloat(1519.99, 7, 2, true))
	require.Equal(t, "0.001208", cFloat(0.0012079, 7, 6, true))
	require.Equal(t, "inf    ", cFloat(math.Inf(1), 7, 2, true))
	require.Equal(t, "   -inf", cFloat(math.Inf(-1), 7, 2, false))
	require.Equal(t, "nan", cFloat(math.NaN(), 0, 2, false))
	require.Equal(t, "0.12", cFloat(0.125, 0, 2, false)) // exact tie rounds to even, as glibc
	require.Equal(t, "0.38", cFloat(0.375, 0, 2, false))
}

func TestFormatGID(t *testing.T) {
	tests := map[string]string{
		"::ffff:10.77.0.12":                      "::ffff:10.77.0.12",
		"fd77::12":                               "fd77::12",
		"::":                                     "::",
		"::1":                                    "::1",
		"::10.77.0.12":                           "::10.77.0.12", // glibc prints IPv4-compatible addresses dotted
		"fe80::5054:ff:fe77:11":                  "fe80::5054:ff:fe77:11",
		"1:0:0:1:0:0:0:1":                        "1:0:0:1::1",
		"2001:db8:0:0:1:0:0:1":                   "2001:db8::1:0:0:1",
		"1:0:2:3:4:5:6:7":                        "1:0:2:3:4:5:6:7",
		"1:2:3:4:5:6:7::":                        "1:2:3:4:5:6:7:0",
		"1::":                                    "1::",
		"::ffff:0.0.0.0":                         "::ffff:0.0.0.0",
		"0:0:0:0:0:1:a4d:c":                      "::1:a4d:c",
		"ffff:ffff:ffff:ffff::":                  "ffff:ffff:ffff:ffff::",
		"1:2:3:4:5:6:7:8":                        "1:2:3:4:5:6:7:8",
		"2001:db8:1234:5678:9abc:def0:1234:5678": "2001:db8:1234:5678:9abc:def0:1234:5678",
	}
	for in, want := range tests {
		require.Equal(t, want, FormatGID(netip.MustParseAddr(in).As16()), in)
	}
	// Everywhere else glibc and RFC 5952 (netip) agree.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		var g [16]byte
		for i := range g {
			// Many zero bytes, so that zero runs of every length occur.
			if rng.IntN(3) > 0 {
				g[i] = byte(rng.IntN(256))
			}
		}
		a := netip.AddrFrom16(g)
		compat := [12]byte(g[:12]) == [12]byte{} && (g[12] != 0 || g[13] != 0)
		if compat {
			continue
		}
		require.Equal(t, a.String(), FormatGID(g), "%x", g)
	}
}
