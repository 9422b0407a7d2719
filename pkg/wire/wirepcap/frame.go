package wirepcap

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/gopacket/gopacket/layers"
	"github.com/rxed/rxed/pkg/wire"
)

// Dissection errors. ErrNotUDP and ErrNotRoCE mark frames that are simply
// something else (decoders report them as skipped); ErrTruncatedFrame marks
// a frame cut short before its UDP header ends.
var (
	ErrNotUDP         = errors.New("wirepcap: not a UDP/IP frame")
	ErrNotRoCE        = errors.New("wirepcap: UDP but not RoCEv2 (port 4791)")
	ErrTruncatedFrame = errors.New("wirepcap: frame truncated before the UDP payload")
	ErrLinkType       = errors.New("wirepcap: unsupported link type")
)

// Link types beyond gopacket's named ones that carry raw IP.
const (
	linkTypeIPv4 layers.LinkType = 228
	linkTypeIPv6 layers.LinkType = 229
	linkTypeRaw2 layers.LinkType = 12 // DLT_RAW on some BSDs
	linkTypeSLL2 layers.LinkType = 276
)

// UDPFrame is a frame dissected down to its UDP payload. Every slice aliases
// the frame data.
type UDPFrame struct {
	L3Offset  int    // offset of the IP header in the frame
	IP        []byte // the IP header (IPv4 with options, or the fixed IPv6 header)
	UDP       []byte // the 8-byte UDP header
	Payload   []byte // UDP payload bounded by the UDP length (Ethernet padding excluded)
	VLAN      []uint16
	Src, Dst  netip.AddrPort
	IPv4      bool
	Truncated bool // the capture holds fewer bytes than the UDP length claims
	// PayloadOffset is the offset of Payload in the frame.
	PayloadOffset int
}

// IsRoCE reports whether the frame goes to UDP port 4791 (rdma_rxe sends
// every packet, requests and responses alike, to that port).
func (f *UDPFrame) IsRoCE() bool { return f.Dst.Port() == wire.UDPPort }

// DissectUDP finds the IP and UDP headers of a frame of the given link type
// (Ethernet with any number of 802.1Q/802.1ad tags, raw IP, Linux cooked
// v1/v2, BSD loopback). It does not allocate and does not trust lengths.
func DissectUDP(lt layers.LinkType, data []byte, out *UDPFrame) error {
	*out = UDPFrame{VLAN: out.VLAN[:0]}
	off := 0
	var ethType uint16
	switch lt {
	case layers.LinkTypeEthernet:
		if len(data) < 14 {
			return ErrTruncatedFrame
		}
		ethType = binary.BigEndian.Uint16(data[12:])
		off = 14
		for ethType == 0x8100 || ethType == 0x88A8 || ethType == 0x9100 {
			if len(data) < off+4 {
				return ErrTruncatedFrame
			}
			out.VLAN = append(out.VLAN, binary.BigEndian.Uint16(data[off:])&0x0FFF)
			ethType = binary.BigEndian.Uint16(data[off+2:])
			off += 4
		}
	case layers.LinkTypeRaw, linkTypeRaw2, linkTypeIPv4, linkTypeIPv6:
		if len(data) == 0 {
			return ErrTruncatedFrame
		}
		ethType = ipEtherType(data[0])
	case layers.LinkTypeLinuxSLL:
		if len(data) < 16 {
			return ErrTruncatedFrame
		}
		ethType, off = binary.BigEndian.Uint16(data[14:]), 16
	case linkTypeSLL2:
		if len(data) < 20 {
			return ErrTruncatedFrame
		}
		ethType, off = binary.BigEndian.Uint16(data[0:]), 20
	case layers.LinkTypeNull, layers.LinkTypeLoop:
		if len(data) < 5 {
			return ErrTruncatedFrame
		}
		ethType, off = ipEtherType(data[4]), 4
	default:
		return ErrLinkType
	}
	out.L3Offset = off
	l3 := data[off:]
	var udpOff, ipEnd int
	switch ethType {
	case 0x0800:
		if len(l3) < 20 {
			return ErrTruncatedFrame
		}
		ihl := int(l3[0]&0x0F) * 4
		if l3[0]>>4 != 4 || ihl < 20 {
			return ErrNotUDP
		}
		if len(l3) < ihl {
			return ErrTruncatedFrame
		}
		if l3[9] != 17 || binary.BigEndian.Uint16(l3[6:])&0x3FFF != 0 {
			return ErrNotUDP // not UDP, or a fragment
		}
		out.IPv4 = true
		out.IP = l3[:ihl:ihl]
		udpOff = ihl
		ipEnd = int(binary.BigEndian.Uint16(l3[2:]))
		s, _ := netip.AddrFromSlice(l3[12:16])
		d, _ := netip.AddrFromSlice(l3[16:20])
		out.Src, out.Dst = netip.AddrPortFrom(s, 0), netip.AddrPortFrom(d, 0)
	case 0x86DD:
		if len(l3) < 40 {
			return ErrTruncatedFrame
		}
		if l3[0]>>4 != 6 || l3[6] != 17 {
			return ErrNotUDP // extension headers are not used by RoCEv2
		}
		out.IP = l3[:40:40]
		udpOff = 40
		ipEnd = 40 + int(binary.BigEndian.Uint16(l3[4:]))
		s, _ := netip.AddrFromSlice(l3[8:24])
		d, _ := netip.AddrFromSlice(l3[24:40])
		out.Src, out.Dst = netip.AddrPortFrom(s, 0), netip.AddrPortFrom(d, 0)
	default:
		return ErrNotUDP
	}
	if len(l3) < udpOff+8 {
		return ErrTruncatedFrame
	}
	udp := l3[udpOff : udpOff+8 : udpOff+8]
	out.UDP = udp
	out.Src = netip.AddrPortFrom(out.Src.Addr(), binary.BigEndian.Uint16(udp[0:]))
	out.Dst = netip.AddrPortFrom(out.Dst.Addr(), binary.BigEndian.Uint16(udp[2:]))
	end := udpOff + int(binary.BigEndian.Uint16(udp[4:]))
	if end < udpOff+8 || end > ipEnd {
		// A UDP length that contradicts the IP length: trust the smaller.
		end = min(max(end, udpOff+8), max(ipEnd, udpOff+8))
	}
	if end > len(l3) {
		out.Truncated = true
		end = len(l3)
	}
	out.Payload = l3[udpOff+8 : end : end]
	out.PayloadOffset = off + udpOff + 8
	return nil
}

// ipEtherType returns the EtherType of a raw IP packet from its first
// byte's version nibble, or 0 for anything but IPv4 and IPv6.
func ipEtherType(first byte) uint16 {
	switch first >> 4 {
	case 4:
		return 0x0800
	case 6:
		return 0x86DD
	}
	return 0
}
