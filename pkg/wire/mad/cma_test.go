package mad

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCMAHeader(t *testing.T) {
	v4 := CMAHeader{IPVersion: 4, SrcPort: 0xe947, Src: netip.MustParseAddr("10.77.0.12"), Dst: netip.MustParseAddr("10.77.0.11")}
	// rping's header (rdmacm_rping_v4.pcap frame 1): the IPv4 addresses
	// sit after 12 zero bytes, not in ::ffff: form.
	v4Bytes := data(t, map[int]string{0: "0040e947", 4: "000000000000000000000000 0a4d000c", 20: "000000000000000000000000 0a4d000b"})[:CMAHeaderLen]
	v6 := CMAHeader{IPVersion: 6, SrcPort: 0x1234, Src: netip.MustParseAddr("fd00::12"), Dst: netip.MustParseAddr("2001:db8::1:b")}
	v6Bytes := data(t, map[int]string{0: "00601234", 4: "fd000000000000000000000000000012", 20: "20010db800000000000000000001000b"})[:CMAHeaderLen]
	// An IPv4-mapped IPv6 header (an IPv6 socket talking to IPv4) keeps
	// the mapped form.
	mapped := CMAHeader{IPVersion: 6, SrcPort: 1, Src: netip.MustParseAddr("::ffff:10.0.0.1"), Dst: netip.MustParseAddr("::ffff:10.0.0.2")}
	mappedBytes := data(t, map[int]string{0: "00600001", 4: "00000000000000000000ffff0a000001", 20: "00000000000000000000ffff0a000002"})[:CMAHeaderLen]
	for _, tc := range []struct {
		name string
		h    CMAHeader
		b    []byte
	}{{"IPv4", v4, v4Bytes}, {"IPv6", v6, v6Bytes}, {"IPv4-mapped IPv6", mapped, mappedBytes}} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, tc.h.Validate())
			require.Equal(t, tc.b, tc.h.Append(nil))
			// Parse takes the header off the front of private data.
			pd := append(bytes.Clone(tc.b), 0xAA, 0xBB)
			got, err := ParseCMAHeader(pd)
			require.NoError(t, err)
			require.Equal(t, tc.h, got)
		})
	}
	// Append unmaps an IPv4-mapped address given with IP version 4.
	m := v4
	m.Src, m.Dst = netip.MustParseAddr("::ffff:10.77.0.12"), netip.MustParseAddr("::ffff:10.77.0.11")
	require.Equal(t, v4Bytes, m.Append(nil))
	// Reserved bits and the IPv4 pad are ignored.
	r := bytes.Clone(v4Bytes)
	r[1] |= 0x0F
	r[4], r[20] = 0xFF, 0xFF
	got, err := ParseCMAHeader(r)
	require.NoError(t, err)
	require.Equal(t, v4, got)
}

func TestCMAHeaderErrors(t *testing.T) {
	good := CMAHeader{IPVersion: 4, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2")}
	b := good.Append(nil)
	for n := range CMAHeaderLen {
		_, err := ParseCMAHeader(b[:n])
		require.ErrorIs(t, err, ErrTruncated, "prefix %d", n)
	}
	bad := bytes.Clone(b)
	bad[0] = 1
	_, err := ParseCMAHeader(bad)
	require.ErrorIs(t, err, ErrBadVersion)
	for _, v := range []byte{0, 5, 7, 15} {
		bad := bytes.Clone(b)
		bad[1] = v << 4
		_, err := ParseCMAHeader(bad)
		require.ErrorIs(t, err, ErrBadField, "IP version %d", v)
	}
	for name, h := range map[string]CMAHeader{
		"version 1":      {CMAVersion: 1, IPVersion: 4, Src: good.Src, Dst: good.Dst},
		"IP version 0":   {Src: good.Src, Dst: good.Dst},
		"IP version 5":   {IPVersion: 5, Src: good.Src, Dst: good.Dst},
		"no source":      {IPVersion: 4, Dst: good.Dst},
		"no destination": {IPVersion: 4, Src: good.Src},
		"IPv6 as 4":      {IPVersion: 4, Src: netip.MustParseAddr("fd00::1"), Dst: good.Dst},
		"IPv4 as 6":      {IPVersion: 6, Src: netip.MustParseAddr("fd00::1"), Dst: good.Dst},
	} {
		err := h.Validate()
		require.Error(t, err, name)
		require.Panics(t, func() { h.Append(nil) }, name)
	}
}

func TestServiceID(t *testing.T) {
	for _, tc := range []struct {
		ps   PortSpace
		port uint16
		id   uint64
	}{
		{PortSpaceTCP, 7174, 0x0000000001061c06},  // rping
		{PortSpaceTCP, 18515, 0x0000000001064853}, // perftest -R
		{PortSpaceUDP, 7174, 0x0000000001111c06},  // udaddy
		{PortSpaceIB, 0, 0x00000000013F0000},
		{PortSpaceIPoIB, 0xFFFF, 0x000000000002FFFF},
	} {
		require.Equal(t, tc.id, ServiceID(tc.ps, tc.port))
		ps, port, ok := SplitServiceID(tc.id)
		require.True(t, ok, "%#x", tc.id)
		require.Equal(t, tc.ps, ps)
		require.Equal(t, tc.port, port)
	}
	for _, id := range []uint64{0x0000000101061c06, 0x1000000001061c06, 0x0000000001071c06, 0} {
		_, _, ok := SplitServiceID(id)
		require.False(t, ok, "%#x is no rdma_cm service ID", id)
	}
	require.Equal(t, "RDMA_PS_TCP", PortSpaceTCP.String())
	require.Equal(t, "RDMA_PS_UDP", PortSpaceUDP.String())
	require.Equal(t, "PortSpace(0x107)", PortSpace(0x107).String())
}

func FuzzCMAHeader(f *testing.F) {
	f.Add(CMAHeader{IPVersion: 4, SrcPort: 1, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2")}.Append(nil))
	f.Add(CMAHeader{IPVersion: 6, SrcPort: 1, Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2")}.Append(nil))
	f.Add(bytes.Repeat([]byte{0xFF}, CMAHeaderLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseCMAHeader(b)
		if err != nil {
			return
		}
		require.NoError(t, h.Validate())
		out := h.Append(nil)
		want := bytes.Clone(b[:CMAHeaderLen])
		want[1] &= 0xF0
		if h.IPVersion == 4 {
			clear(want[4:16])
			clear(want[20:32])
		}
		require.Equal(t, want, out)
		h2, err := ParseCMAHeader(out)
		require.NoError(t, err)
		require.Equal(t, h, h2)
	})
}
