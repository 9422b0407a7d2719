package transport

import (
	"encoding/binary"
	"net/netip"
)

// Header lengths of the frames the pcap recorder synthesises.
const (
	ethHeaderLen  = 14
	ipv4HeaderLen = 20
	ipv6HeaderLen = 40
	udpHeaderLen  = 8
)

// defaultTTL is what Linux puts in IPv4 TTL / IPv6 hop limit by default
// (net.ipv4.ip_default_ttl, net.ipv6.conf.*.hop_limit), and what rdma_rxe
// sends.
const defaultTTL = 64

// putIPv4Header writes the IPv4 header Linux builds for a datagram of udpLen
// bytes (UDP header included) sent from an unconnected IP_PMTUDISC_DO socket:
// TOS 0, ID 0 (Linux uses 0 for DF packets not belonging to a connected
// socket), DF, TTL 64, no options, with the header checksum.
func putIPv4Header(b []byte, src, dst netip.Addr, udpLen int) {
	_ = b[ipv4HeaderLen-1]
	b[0] = 0x45
	b[1] = 0
	binary.BigEndian.PutUint16(b[2:], uint16(ipv4HeaderLen+udpLen))
	binary.BigEndian.PutUint16(b[4:], 0)      // identification
	binary.BigEndian.PutUint16(b[6:], 0x4000) // DF, fragment offset 0
	b[8] = defaultTTL
	b[9] = 17 // UDP
	b[10], b[11] = 0, 0
	s, d := src.As4(), dst.As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	binary.BigEndian.PutUint16(b[10:], ipv4Checksum(b[:ipv4HeaderLen]))
}

// setIPv4ID replaces the identification field and fixes the checksum.
func setIPv4ID(b []byte, id uint16) {
	binary.BigEndian.PutUint16(b[4:], id)
	b[10], b[11] = 0, 0
	binary.BigEndian.PutUint16(b[10:], ipv4Checksum(b[:ipv4HeaderLen]))
}

func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// putIPv6Header writes an IPv6 header with traffic class 0, flow label 0
// (Linux may set an automatic flow label; the ICRC masks it) and hop limit 64.
func putIPv6Header(b []byte, src, dst netip.Addr, udpLen int) {
	_ = b[ipv6HeaderLen-1]
	binary.BigEndian.PutUint32(b[0:], 6<<28)
	binary.BigEndian.PutUint16(b[4:], uint16(udpLen))
	b[6] = 17 // UDP
	b[7] = defaultTTL
	s, d := src.As16(), dst.As16()
	copy(b[8:24], s[:])
	copy(b[24:40], d[:])
}

// putUDPHeader writes a UDP header with checksum 0, which is what rdma_rxe
// sends; the ICRC masks the field.
func putUDPHeader(b []byte, sport, dport uint16, payloadLen int) {
	_ = b[udpHeaderLen-1]
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(udpHeaderLen+payloadLen))
	b[6], b[7] = 0, 0
}
