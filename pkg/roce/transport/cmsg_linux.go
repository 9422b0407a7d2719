//go:build linux

package transport

import (
	"encoding/binary"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rxOOBSize holds an in6_pktinfo, UDP_GRO and SO_RXQ_OVFL cmsgs and the
// traffic class, hop limit and flow info ones (ReportTraffic): 160 bytes
// on 64-bit, with room for one more (a truncated buffer loses the last).
const rxOOBSize = 184

// txOOBSpace holds a UDP_SEGMENT and an IP(V6)_PKTINFO control message,
// and the TOS and TTL ones of a non-default Endpoint (traffic_linux.go).
var txOOBSpace = unix.CmsgSpace(2) + unix.CmsgSpace(unix.SizeofInet6Pktinfo) + txTrafficSpace

// parseCmsgs reads the destination address (IP_PKTINFO / IPV6_PKTINFO) and
// the GRO segment size without allocating.
func (s *udpSocket) parseCmsgs(m *rxMsg, oob []byte) {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return
		}
		data := oob[unix.CmsgLen(0):l]
		switch {
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
			// struct in_pktinfo: ifindex, spec_dst, addr (header destination).
			m.local = netip.AddrFrom4([4]byte(data[8:12]))
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			m.local = netip.AddrFrom16([16]byte(data[0:16])).Unmap()
		case h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && len(data) >= 4:
			m.segSize = int(binary.NativeEndian.Uint32(data))
		case h.Level == unix.SOL_SOCKET && h.Type == unix.SO_RXQ_OVFL && len(data) >= 4:
			s.noteOverflow(binary.NativeEndian.Uint32(data))
		default:
			parseTrafficCmsg(m, h.Level, h.Type, data) // only while ReportTraffic is on
		}
		next := unix.CmsgSpace(l - unix.CmsgLen(0))
		if next > len(oob) {
			return
		}
		oob = oob[next:]
	}
}

// setSource prepares the control message that makes a wildcard-bound socket
// send from src (none when src is invalid or unspecified), over IPv6 on
// interface ifindex when it is not 0 (a link-local source or destination
// needs one; scope_linux.go).
func (y *sockSys) setSource(src netip.Addr, is6 bool, ifindex uint32) {
	y.txSrc = y.txSrcB[:0]
	if !src.IsValid() || src.IsUnspecified() || src.Is6() != is6 {
		return
	}
	b := y.txSrcB[:]
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	if is6 {
		h.Level, h.Type = unix.IPPROTO_IPV6, unix.IPV6_PKTINFO
		h.SetLen(unix.CmsgLen(unix.SizeofInet6Pktinfo))
		clear(b[unix.CmsgLen(0):unix.CmsgSpace(unix.SizeofInet6Pktinfo)])
		a := src.As16()
		pi := b[unix.CmsgLen(0):] // struct in6_pktinfo: ipi6_addr, ipi6_ifindex
		copy(pi, a[:])
		binary.NativeEndian.PutUint32(pi[16:], ifindex)
		y.txSrc = b[:unix.CmsgSpace(unix.SizeofInet6Pktinfo)]
		return
	}
	h.Level, h.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
	clear(b[unix.CmsgLen(0):unix.CmsgSpace(unix.SizeofInet4Pktinfo)])
	a := src.As4()
	copy(b[unix.CmsgLen(0)+4:], a[:]) // in_pktinfo.ipi_spec_dst: the source address
	y.txSrc = b[:unix.CmsgSpace(unix.SizeofInet4Pktinfo)]
}

// noteOverflow folds the kernel's drop counter of this socket (a 32-bit
// running count, SO_RXQ_OVFL) into the Conn's DropRcvbuf.
func (s *udpSocket) noteOverflow(count uint32) {
	if d := count - s.sys.ovfl; d != 0 && d < 1<<31 {
		s.sys.ovfl = count
		s.conn.stats.dropRcvbuf.Add(uint64(d))
	}
}

// putSegmentCmsg writes the UDP_SEGMENT control message (the GSO segment
// size, a u16) at the start of b and returns the bytes it took
// (CmsgSpace(2)); b must hold that many.
func putSegmentCmsg(b []byte, seg int) int {
	ch := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	ch.Level = unix.SOL_UDP
	ch.Type = unix.UDP_SEGMENT
	ch.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(b[unix.CmsgLen(0):], uint16(seg))
	return unix.CmsgSpace(2)
}
