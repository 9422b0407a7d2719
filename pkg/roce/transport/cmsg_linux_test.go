//go:build linux

package transport

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// cmsg builds one control message the way the kernel lays it out
// (header, data, padding to CmsgSpace).
func cmsg(level, typ int, data []byte) []byte {
	b := make([]byte, unix.CmsgSpace(len(data)))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = int32(level), int32(typ)
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[unix.CmsgLen(0):], data)
	return b
}

func u32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

func pktinfo4(specDst, addr string) []byte {
	return unix.PktInfo4(&unix.Inet4Pktinfo{Ifindex: 3,
		Spec_dst: netip.MustParseAddr(specDst).As4(), Addr: netip.MustParseAddr(addr).As4()})
}

func pktinfo6(addr string) []byte {
	return unix.PktInfo6(&unix.Inet6Pktinfo{Addr: netip.MustParseAddr(addr).As16(), Ifindex: 3})
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// cmsgSocket is a udpSocket with only what parseCmsgs touches.
func cmsgSocket() *udpSocket {
	return &udpSocket{conn: &udpConn{}, local: netip.MustParseAddrPort("0.0.0.0:4791")}
}

// TestParseCmsgs decodes the receive side's control messages: the
// destination address from IP_PKTINFO (the header's destination,
// ipi_addr, not the routing one) or IPV6_PKTINFO, the GRO segment size,
// the kernel's socket-buffer drop count; anything else is skipped, and a
// malformed buffer stops the walk without reading past its end.
func TestParseCmsgs(t *testing.T) {
	const bound = "10.0.0.9" // what m.local is before parsing
	for _, tc := range []struct {
		name      string
		oob       []byte
		wantLocal string
		wantSeg   int
		wantDrops uint64
	}{
		{name: "none", oob: nil, wantLocal: bound},
		{name: "IP_PKTINFO", oob: pktinfo4("10.0.0.1", "10.0.0.2"), wantLocal: "10.0.0.2"},
		{name: "IPV6_PKTINFO", oob: pktinfo6("2001:db8::2"), wantLocal: "2001:db8::2"},
		{name: "IPV6_PKTINFO v4-mapped", oob: pktinfo6("::ffff:10.0.0.3"), wantLocal: "10.0.0.3"},
		{name: "UDP_GRO", oob: cmsg(unix.SOL_UDP, unix.UDP_GRO, u32(1400)), wantLocal: bound, wantSeg: 1400},
		{name: "SO_RXQ_OVFL", oob: cmsg(unix.SOL_SOCKET, unix.SO_RXQ_OVFL, u32(5)), wantLocal: bound, wantDrops: 5},
		{name: "all three", oob: cat(pktinfo4("0.0.0.0", "10.0.0.2"), cmsg(unix.SOL_UDP, unix.UDP_GRO, u32(1024)),
			cmsg(unix.SOL_SOCKET, unix.SO_RXQ_OVFL, u32(7))), wantLocal: "10.0.0.2", wantSeg: 1024, wantDrops: 7},
		{name: "unknown ones skipped", oob: cat(cmsg(unix.SOL_SOCKET, unix.SO_TIMESTAMP, make([]byte, 16)),
			cmsg(unix.IPPROTO_IP, unix.IP_TTL, u32(64)), pktinfo6("fd00::7")), wantLocal: "fd00::7"},
		{name: "short IP_PKTINFO ignored", oob: cmsg(unix.IPPROTO_IP, unix.IP_PKTINFO, make([]byte, 8)), wantLocal: bound},
		{name: "short UDP_GRO ignored", oob: cmsg(unix.SOL_UDP, unix.UDP_GRO, []byte{1, 2}), wantLocal: bound},
		{name: "truncated header", oob: pktinfo4("10.0.0.1", "10.0.0.2")[:unix.SizeofCmsghdr-1], wantLocal: bound},
		{name: "length below the header", oob: func() []byte {
			b := cmsg(unix.SOL_UDP, unix.UDP_GRO, u32(1400))
			(*unix.Cmsghdr)(unsafe.Pointer(&b[0])).SetLen(unix.SizeofCmsghdr - 1)
			return b
		}(), wantLocal: bound},
		{name: "zero length (would loop forever)", oob: func() []byte {
			b := cat(cmsg(unix.SOL_UDP, unix.UDP_GRO, u32(1400)), pktinfo6("fd00::7"))
			(*unix.Cmsghdr)(unsafe.Pointer(&b[0])).SetLen(0)
			return b
		}(), wantLocal: bound},
		{name: "length past the buffer", oob: func() []byte {
			b := cmsg(unix.SOL_UDP, unix.UDP_GRO, u32(1400))
			(*unix.Cmsghdr)(unsafe.Pointer(&b[0])).SetLen(len(b) + 1)
			return b
		}(), wantLocal: bound},
		{name: "last one unpadded", oob: cat(cmsg(unix.SOL_UDP, unix.UDP_GRO, u32(900)),
			pktinfo4("0.0.0.0", "10.0.0.4")[:unix.CmsgLen(unix.SizeofInet4Pktinfo)]),
			wantLocal: "10.0.0.4", wantSeg: 900},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := cmsgSocket()
			m := rxMsg{local: netip.MustParseAddr(bound)}
			s.parseCmsgs(&m, tc.oob)
			require.Equal(t, netip.MustParseAddr(tc.wantLocal), m.local)
			require.Equal(t, tc.wantSeg, m.segSize)
			require.Equal(t, tc.wantDrops, s.conn.stats.dropRcvbuf.Load())
		})
	}
}

// TestParseCmsgsEveryPrefix cuts a valid buffer of three control messages
// at every length: parsing never panics, and every value it reports is
// one of a message wholly inside the prefix.
func TestParseCmsgsEveryPrefix(t *testing.T) {
	p1 := pktinfo6("2001:db8::5")
	p2 := cmsg(unix.SOL_UDP, unix.UDP_GRO, u32(1200))
	p3 := cmsg(unix.SOL_SOCKET, unix.SO_RXQ_OVFL, u32(9))
	oob := cat(p1, p2, p3)
	for n := 0; n <= len(oob); n++ {
		s := cmsgSocket()
		m := rxMsg{}
		s.parseCmsgs(&m, oob[:n])
		whole := func(end, datalen int) bool { return n >= end-len(cmsgPad(datalen)) }
		if whole(len(p1), unix.SizeofInet6Pktinfo) {
			require.Equal(t, netip.MustParseAddr("2001:db8::5"), m.local, "prefix %d", n)
		} else {
			require.False(t, m.local.IsValid(), "prefix %d", n)
		}
		if whole(len(p1)+len(p2), 4) {
			require.Equal(t, 1200, m.segSize, "prefix %d", n)
		} else {
			require.Zero(t, m.segSize, "prefix %d", n)
		}
		if whole(len(oob), 4) {
			require.Equal(t, uint64(9), s.conn.stats.dropRcvbuf.Load(), "prefix %d", n)
		} else {
			require.Zero(t, s.conn.stats.dropRcvbuf.Load(), "prefix %d", n)
		}
	}
}

// cmsgPad is the padding after a control message of datalen bytes.
func cmsgPad(datalen int) []byte {
	return make([]byte, unix.CmsgSpace(datalen)-unix.CmsgLen(datalen))
}

// TestNoteOverflow folds the kernel's 32-bit running drop count into
// DropRcvbuf: only increases count, across the wrap, and a count that
// went backwards (a stale stamp) is ignored.
func TestNoteOverflow(t *testing.T) {
	s := cmsgSocket()
	for _, step := range []struct {
		count uint32
		total uint64
	}{
		{0, 0}, {5, 5}, {5, 5}, {7, 7}, {6, 7}, {0xFFFFFFFE, 7}, {1, 7},
	} {
		s.noteOverflow(step.count)
		require.Equal(t, step.total, s.conn.stats.dropRcvbuf.Load(), "count %d", step.count)
	}
	s = cmsgSocket()
	s.sys.ovfl = 0xFFFFFFFE
	s.noteOverflow(1) // wrapped: 0xFFFFFFFF, 0, 1
	require.Equal(t, uint64(3), s.conn.stats.dropRcvbuf.Load())
}

// TestSetSource encodes the control message that makes a wildcard-bound
// socket send from a given address, byte for byte what x/sys builds for
// the kernel (IP_PKTINFO with ipi_spec_dst, IPV6_PKTINFO with ipi6_addr
// and, for a link-local source of a socket bound to ::, ipi6_ifindex),
// and none when the address cannot be a source of the socket's family.
//
// Bug (link-local from a socket bound to ::, lead's task list): the
// IPV6_PKTINFO had no ifindex, and a link-local source without one is
// EINVAL.
func TestSetSource(t *testing.T) {
	spec4 := func(a string) []byte {
		return unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: netip.MustParseAddr(a).As4()})
	}
	addr6 := func(a string, ifindex uint32) []byte {
		return unix.PktInfo6(&unix.Inet6Pktinfo{Addr: netip.MustParseAddr(a).As16(), Ifindex: ifindex})
	}
	for _, tc := range []struct {
		src     netip.Addr
		is6     bool
		ifindex uint32
		want    []byte
	}{
		{netip.MustParseAddr("127.0.0.9"), false, 0, spec4("127.0.0.9")},
		{netip.MustParseAddr("10.1.2.3"), false, 0, spec4("10.1.2.3")},
		{netip.MustParseAddr("::1"), true, 0, addr6("::1", 0)},
		{netip.MustParseAddr("2001:db8::9"), true, 0, addr6("2001:db8::9", 0)},
		{netip.MustParseAddr("fe80::b"), true, 7, addr6("fe80::b", 7)},
		{netip.MustParseAddr("fe80::1:2:3:4"), true, 0x01020304, addr6("fe80::1:2:3:4", 0x01020304)},
		{netip.Addr{}, false, 0, nil},
		{netip.Addr{}, true, 3, nil},
		{netip.IPv4Unspecified(), false, 0, nil},
		{netip.IPv6Unspecified(), true, 3, nil},
		{netip.MustParseAddr("::1"), false, 0, nil},     // IPv6 source, IPv4 socket
		{netip.MustParseAddr("10.1.2.3"), true, 0, nil}, // IPv4 source, IPv6 socket
	} {
		var y sockSys
		// Stale bytes of an earlier, longer encoding must not leak in.
		y.setSource(netip.MustParseAddr("2001:db8::ffff"), true, 0xFFFFFFFF)
		y.setSource(tc.src, tc.is6, tc.ifindex)
		if tc.want == nil {
			require.Empty(t, y.txSrc, "%v is6=%v", tc.src, tc.is6)
			continue
		}
		require.Equal(t, tc.want, []byte(y.txSrc), "%v is6=%v", tc.src, tc.is6)
	}
}

// TestPutSegmentCmsg encodes UDP_SEGMENT (a u16 segment size) as the
// kernel's cmsg parser reads it.
func TestPutSegmentCmsg(t *testing.T) {
	for _, seg := range []int{1, 1024, 4096 + 48, 0xFFFF} {
		b := make([]byte, txOOBSpace)
		n := putSegmentCmsg(b, seg)
		require.Equal(t, unix.CmsgSpace(2), n)
		cms, err := unix.ParseSocketControlMessage(b[:n])
		require.NoError(t, err)
		require.Len(t, cms, 1)
		require.Equal(t, int32(unix.SOL_UDP), cms[0].Header.Level)
		require.Equal(t, int32(unix.UDP_SEGMENT), cms[0].Header.Type)
		require.Equal(t, seg, int(binary.NativeEndian.Uint16(cms[0].Data)))
	}
}

// FuzzParseCmsgs feeds arbitrary control buffers to parseCmsgs: it must
// return without reading outside the buffer, whatever the lengths say,
// and agree with a reference walk built on x/sys's own cmsg parser
// (ParseOneSocketControlMessage, which the kernel's CMSG_NXTHDR rules
// also give): the last whole IP(V6)_PKTINFO's header destination, the
// last UDP_GRO size and the SO_RXQ_OVFL counts in order. Messages after
// a malformed one are not read.
func FuzzParseCmsgs(f *testing.F) {
	f.Add(cat(pktinfo4("0.0.0.0", "10.0.0.2"), cmsg(unix.SOL_UDP, unix.UDP_GRO, u32(1024))))
	f.Add(cat(pktinfo6("fd00::1"), cmsg(unix.SOL_SOCKET, unix.SO_RXQ_OVFL, u32(3))))
	f.Add(cat(cmsg(unix.SOL_SOCKET, unix.SO_RXQ_OVFL, u32(3)), pktinfo6("::ffff:10.0.0.1"),
		cmsg(unix.SOL_SOCKET, unix.SO_RXQ_OVFL, u32(1)), cmsg(unix.SOL_UDP, unix.UDP_GRO, []byte{1})))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, oob []byte) {
		s := cmsgSocket()
		var m rxMsg
		s.parseCmsgs(&m, oob)

		ref := cmsgSocket()
		var want rxMsg
		for b := oob; len(b) >= unix.SizeofCmsghdr; {
			h, data, rest, err := unix.ParseOneSocketControlMessage(b)
			if err != nil {
				break
			}
			switch {
			case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
				var pi unix.Inet4Pktinfo
				copy(unsafe.Slice((*byte)(unsafe.Pointer(&pi)), unsafe.Sizeof(pi)), data)
				want.local = netip.AddrFrom4(pi.Addr)
			case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
				var pi unix.Inet6Pktinfo
				copy(unsafe.Slice((*byte)(unsafe.Pointer(&pi)), unsafe.Sizeof(pi)), data)
				want.local = netip.AddrFrom16(pi.Addr).Unmap()
			case h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && len(data) >= 4:
				want.segSize = int(binary.NativeEndian.Uint32(data))
			case h.Level == unix.SOL_SOCKET && h.Type == unix.SO_RXQ_OVFL && len(data) >= 4:
				ref.noteOverflow(binary.NativeEndian.Uint32(data))
			}
			b = rest
		}
		require.Equal(t, want.local, m.local)
		require.Equal(t, want.segSize, m.segSize)
		require.Equal(t, ref.sys.ovfl, s.sys.ovfl)
		require.Equal(t, ref.conn.stats.dropRcvbuf.Load(), s.conn.stats.dropRcvbuf.Load())
	})
}
