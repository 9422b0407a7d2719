//go:build linux

package transport

import (
	"encoding/binary"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rxed/rxed/pkg/wire"
)

// txTrafficSpace is the room of the control messages putTrafficCmsgs
// writes: two, each an int.
var txTrafficSpace = 2 * unix.CmsgSpace(4)

// putTrafficCmsgs writes into b the control messages that give a
// datagram t's IP header fields (none for a zero t) and returns the
// bytes they took; b must hold txTrafficSpace. The kernel takes an int
// for each (ip_cmsg_send, ip6_datagram_send_ctl): IP_TOS and IP_TTL over
// IPv4, IPV6_TCLASS and IPV6_HOPLIMIT over IPv6. A hop limit of 0 is
// the socket's (an IP_TTL of 0 is refused).
func putTrafficCmsgs(b []byte, is6 bool, t ipTraffic) int {
	classLevel, classType := unix.IPPROTO_IP, unix.IP_TOS
	hopsLevel, hopsType := unix.IPPROTO_IP, unix.IP_TTL
	if is6 {
		classLevel, classType = unix.IPPROTO_IPV6, unix.IPV6_TCLASS
		hopsLevel, hopsType = unix.IPPROTO_IPV6, unix.IPV6_HOPLIMIT
	}
	n := 0
	if t.class != 0 {
		n += putIntCmsg(b[n:], classLevel, classType, int32(t.class))
	}
	if t.hops != 0 {
		n += putIntCmsg(b[n:], hopsLevel, hopsType, int32(t.hops))
	}
	return n
}

// putIntCmsg writes one control message carrying an int and returns
// its space.
func putIntCmsg(b []byte, level, typ int, v int32) int {
	sp := unix.CmsgSpace(4)
	clear(b[:sp])
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = int32(level), int32(typ)
	h.SetLen(unix.CmsgLen(4))
	binary.NativeEndian.PutUint32(b[unix.CmsgLen(0):], uint32(v))
	return sp
}

// setTraffic prepares the control messages of t for the messages of a
// send (pack copies them into each); none for the socket's defaults, so
// that the common send adds nothing but this compare.
func (y *sockSys) setTraffic(is6 bool, t ipTraffic) {
	if t == (ipTraffic{}) {
		y.txTraf = y.txTrafB[:0]
		return
	}
	y.txTraf = y.txTrafB[:putTrafficCmsgs(y.txTrafB[:], is6, t)]
}

// IPv6 socket options x/sys does not name (include/uapi/linux/in6.h).
const (
	// ipv6FlowInfo (IPV6_FLOWINFO) set on a socket has recvmsg deliver
	// an IPV6_FLOWINFO control message with a datagram's flow info, the
	// first word of its header without the version, big-endian
	// (ip6_datagram_recv_specific_ctl, rxopt.bits.rxflow); the kernel
	// leaves it out when that word is 0.
	ipv6FlowInfo = 11
)

// recvTraffic switches the kernel's control messages carrying a received
// datagram's TOS and TTL (IPv6 traffic class, hop limit and flow info)
// on or off. Off, parseCmsgs meets none: a receive costs nothing more
// than before.
func (s *udpSocket) recvTraffic(on bool) error {
	v := 0
	if on {
		v = 1
	}
	var err error
	cerr := s.sys.rc.Control(func(fd uintptr) {
		f := int(fd)
		if s.is6 {
			err = unix.SetsockoptInt(f, unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, v)
			if err == nil {
				err = unix.SetsockoptInt(f, unix.IPPROTO_IPV6, unix.IPV6_RECVHOPLIMIT, v)
			}
			if err == nil {
				// The flow label, for a UD GRH: a third message
				// only for datagrams whose label or class is not 0.
				err = unix.SetsockoptInt(f, unix.IPPROTO_IPV6, ipv6FlowInfo, v)
			}
			return
		}
		err = unix.SetsockoptInt(f, unix.IPPROTO_IP, unix.IP_RECVTOS, v)
		if err == nil {
			err = unix.SetsockoptInt(f, unix.IPPROTO_IP, unix.IP_RECVTTL, v)
		}
	})
	if cerr != nil {
		return cerr
	}
	return err
}

// parseTrafficCmsg takes a received datagram's TOS or TTL (IPv6 traffic
// class, hop limit or flow label) from one control message into m, if it
// is one: IP_TOS carries a byte (ip_cmsg_recv_tos), IPV6_FLOWINFO a
// big-endian word (the header's, version masked off), the others an int.
func parseTrafficCmsg(m *rxMsg, level, typ int32, data []byte) {
	switch {
	case level == unix.IPPROTO_IP && typ == unix.IP_TOS && len(data) >= 1:
		m.class = data[0]
	case level == unix.IPPROTO_IP && typ == unix.IP_TTL && len(data) >= 4:
		m.hops = uint8(binary.NativeEndian.Uint32(data))
	case level == unix.IPPROTO_IPV6 && typ == unix.IPV6_TCLASS && len(data) >= 4:
		m.class = uint8(binary.NativeEndian.Uint32(data))
	case level == unix.IPPROTO_IPV6 && typ == unix.IPV6_HOPLIMIT && len(data) >= 4:
		m.hops = uint8(binary.NativeEndian.Uint32(data))
	case level == unix.IPPROTO_IPV6 && typ == ipv6FlowInfo && len(data) >= 4:
		m.flow = binary.BigEndian.Uint32(data) & wire.FlowLabelMask
	}
}
