package wire

import "encoding/binary"

// FlowLabelMask is the IPv6 flow label's part of the header's first word
// (version_tclass_flow) and of Linux's flow info (IPV6_FLOWINFO_FLOWLABEL);
// the traffic class sits above it.
const FlowLabelMask = 0x000FFFFF

// IPTrafficClass reads the traffic class of the IP header ip (20 bytes of
// IPv4 or 40 of IPv6): the IPv4 TOS, or bits 20-27 of the IPv6 header's
// first word. SetIPTraffic writes it.
func IPTrafficClass(ip []byte) uint8 {
	if ip[0]>>4 == 6 {
		return uint8(binary.BigEndian.Uint32(ip[0:4]) >> 20)
	}
	return ip[1]
}

// SetIPTraffic writes into the IP header ip (20 bytes of IPv4 or 40 of
// IPv6, as PutIPHeader wrote it) the fields a sender chooses per packet
// and the ICRC masks: the TOS and TTL of IPv4 (then fixing the header
// checksum), or the traffic class, flow label (20 bits) and hop limit of
// IPv6. A hop limit of 0 leaves the header's (64): rxed sends 0 as the
// socket's default.
func SetIPTraffic(ip []byte, class, hopLimit uint8, flowLabel uint32) {
	if ip[0]>>4 == 4 {
		ip[1] = class
		if hopLimit != 0 {
			ip[8] = hopLimit
		}
		fixIPv4Checksum(ip)
		return
	}
	binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(class)<<20|flowLabel&FlowLabelMask)
	if hopLimit != 0 {
		ip[7] = hopLimit
	}
}
