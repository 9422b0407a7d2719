package wire

import (
	"encoding/binary"
	"hash/crc32"
	"math/bits"
	"net/netip"
)

// Flow is one direction of a RoCEv2 conversation: the packet goes from Src
// to Dst (addresses and UDP ports). To seal an outgoing packet use
// Flow{Src: local, Dst: remote}; to verify an incoming one use
// Flow{Src: remote, Dst: local} (see Reverse). IPv4-mapped IPv6 addresses
// are treated as IPv4, like the kernel does for RoCEv2 IPv4 GIDs.
type Flow struct {
	Src, Dst netip.AddrPort
}

// Reverse returns the flow of the opposite direction.
func (f Flow) Reverse() Flow { return Flow{Src: f.Dst, Dst: f.Src} }

// IsIPv4 reports whether the flow is carried over IPv4.
func (f Flow) IsIPv4() bool { return f.Src.Addr().Unmap().Is4() && f.Dst.Addr().Unmap().Is4() }

// valid reports whether both ends have a usable address of one family.
func (f Flow) valid() bool {
	s, d := f.Src.Addr().Unmap(), f.Dst.Addr().Unmap()
	return s.IsValid() && d.IsValid() && s.Is4() == d.Is4()
}

// IPv4 header values Linux uses for a UDP socket with IP_PMTUDISC_DO that
// is not connect()ed: Identification 0 (ip_select_ident gives DF packets of
// unconnected sockets ID 0) and DF. TOS, TTL and checksum are masked.
const (
	ipv4FlagDF   = 0x4000
	ipv4ProtoUDP = 17
)

// headers builds the IP and UDP headers Linux sends for pkt (the whole UDP
// payload). Only unmasked fields matter to the ICRC, so the IPv4 header
// checksum (masked) is left 0. The IP header is 20 bytes long exactly when
// the flow is IPv4.
func (f Flow) headers(ip *ipHeaderBuf, udp *[8]byte, pktLen int) []byte {
	f.putUDP(udp[:], pktLen)
	return ip[:f.putIP(ip[:], 8+pktLen)]
}

// putIP writes the IP header of a datagram of udpLen bytes (UDP header
// included) into b, which must be zero, without the IPv4 header checksum,
// and returns its length.
func (f Flow) putIP(b []byte, udpLen int) int {
	src, dst := f.Src.Addr().Unmap(), f.Dst.Addr().Unmap()
	if src.Is4() && dst.Is4() {
		b = b[:20]
		b[0] = 0x45
		binary.BigEndian.PutUint16(b[2:], uint16(20+udpLen))
		binary.BigEndian.PutUint16(b[6:], ipv4FlagDF)
		b[8] = 64
		b[9] = ipv4ProtoUDP
		s, d := src.As4(), dst.As4()
		copy(b[12:16], s[:])
		copy(b[16:20], d[:])
		return 20
	}
	b = b[:40]
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(udpLen))
	b[6] = ipv4ProtoUDP
	b[7] = 64
	s, d := src.As16(), dst.As16()
	copy(b[8:24], s[:])
	copy(b[24:40], d[:])
	return 40
}

// putUDP writes the UDP header for a payload of payloadLen bytes, checksum
// 0 as rdma_rxe sends (the ICRC masks it).
func (f Flow) putUDP(b []byte, payloadLen int) {
	binary.BigEndian.PutUint16(b[0:], f.Src.Port())
	binary.BigEndian.PutUint16(b[2:], f.Dst.Port())
	binary.BigEndian.PutUint16(b[4:], uint16(8+payloadLen))
	b[6], b[7] = 0, 0
}

// PutIPHeader writes into b the IP header Linux sends for a UDP datagram
// of udpLen bytes (UDP header included) on flow f (see Seal: IPv4 TOS 0,
// ID 0, DF, TTL 64, with its header checksum; IPv6 traffic class and flow
// label 0, hop limit 64) and returns its length: 20 for an IPv4 flow, 40
// otherwise. b must hold 40 bytes for IPv6. It is the header the ICRC of
// Seal covers, for whoever needs it whole: a pcap writer, a UD GRH.
func (f Flow) PutIPHeader(b []byte, udpLen int) int {
	if f.IsIPv4() {
		clear(b[:20])
	} else {
		clear(b[:40])
	}
	n := f.putIP(b, udpLen)
	if n == 20 {
		binary.BigEndian.PutUint16(b[10:], IPv4Checksum(b[:20]))
	}
	return n
}

// PutHeaders writes the IP header (PutIPHeader) and the UDP header
// (checksum 0) of a datagram carrying payloadLen bytes on flow f, and
// returns the IP header's length; the UDP header follows it.
func (f Flow) PutHeaders(b []byte, payloadLen int) int {
	n := f.PutIPHeader(b, 8+payloadLen)
	f.putUDP(b[n:], payloadLen)
	return n
}

// SetIPv4ID replaces the Identification of the IPv4 header ip (20 bytes)
// and fixes its checksum.
func SetIPv4ID(ip []byte, id uint16) {
	binary.BigEndian.PutUint16(ip[4:], id)
	fixIPv4Checksum(ip)
}

// fixIPv4Checksum recomputes the checksum of the IPv4 header ip (20
// bytes) after a field of it changed.
func fixIPv4Checksum(ip []byte) {
	ip[10], ip[11] = 0, 0
	binary.BigEndian.PutUint16(ip[10:], IPv4Checksum(ip[:20]))
}

// SetIPv4Unseen writes into the IPv4 header ip (20 bytes) the two
// ICRC-covered fields a UDP receiver does not see, as VerifyIPv4 solved
// them: the Identification and the DF flag (set unless dfClear; the other
// flags and the fragment offset are kept), and fixes its checksum.
func SetIPv4Unseen(ip []byte, id uint16, dfClear bool) {
	ff := binary.BigEndian.Uint16(ip[6:]) | ipv4FlagDF
	if dfClear {
		ff &^= ipv4FlagDF
	}
	binary.BigEndian.PutUint16(ip[6:], ff)
	SetIPv4ID(ip, id)
}

// IPv4Checksum is the Internet checksum of an IPv4 header h (0 for a
// header whose checksum field is right).
func IPv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// ipHeaderBuf is big enough for both header kinds; the IPv6 one needs 40.
type ipHeaderBuf = [40]byte

// Seal writes the ICRC into the last four bytes of pkt (a whole UDP
// payload: BTH ... pad, ICRC slot), computed for exactly the IP and UDP
// headers Linux will put on it when sent from f.Src to f.Dst on an
// unconnected IP_PMTUDISC_DO socket: IPv4 ID 0 and DF (IPv6: nothing
// unmasked beyond lengths and addresses). pkt shorter than a BTH plus ICRC
// is left alone.
func (f Flow) Seal(pkt []byte) {
	if len(pkt) < BTHLen+ICRCLen {
		return
	}
	n := len(pkt) - ICRCLen
	binary.LittleEndian.PutUint32(pkt[n:], f.icrc(pkt[:n]))
}

// icrc is the ICRC of roce (a UDP payload without its ICRC, at least a
// BTH) sent on f with the headers Seal describes. On an IPv4 flow the
// masked header words come straight from the flow (words4); on any other
// the headers are built and ICRC runs.
func (f Flow) icrc(roce []byte) uint32 {
	rest := roce[BTHLen:]
	if w0, w1, w2, w3, ok := f.words4(8 + len(roce) + ICRCLen); ok {
		w3 |= le32(roce) << 32
		w4 := le64(roce[4:]) | 0xFF // FECN, BECN, resv6
		if foldable(len(rest)) {
			blk := [8]uint64{w0, w1, w2, w3, w4}
			crc, _ := foldBlock(&blk, 40, roce[:BTHLen], rest, nil) // no extension headers: always ok
			return crc
		}
		st := headerReg4(w0, w1, w2, w3, w4)
		if len(rest) < 64 {
			return slicing8Update(^st, rest)
		}
		return crc32.Update(^st, ieee, rest)
	}
	var ip ipHeaderBuf
	var udp [8]byte
	h := f.headers(&ip, &udp, len(roce)+ICRCLen)
	return ICRC(h, udp[:], roce)
}

// words4 returns, for a datagram of udpLen bytes (UDP header included)
// on an IPv4 flow, the first four of maskedIPv4's words over the headers
// Seal describes (w3 without the BTH's first four bytes), computed from
// the flow's addresses and ports: what headers would write and
// maskedIPv4 read back, at a third of the cost for an ACK's ICRC
// (docs/performance.md, session R). ok is false for any other flow.
func (f Flow) words4(udpLen int) (w0, w1, w2, w3 uint64, ok bool) {
	src, dst := f.Src.Addr().Unmap(), f.Dst.Addr().Unmap()
	if !src.Is4() || !dst.Is4() {
		return 0, 0, 0, 0, false
	}
	s, d := src.As4(), dst.As4()
	be16 := func(v uint16) uint64 { return uint64(bits.ReverseBytes16(v)) }
	w0 = 0x45 | 0xFF<<8 | be16(uint16(20+udpLen))<<16 | ipv4FlagDF>>8<<48                   // version and IHL, TOS (masked), total length, ID 0, DF
	w1 = 0xFF | ipv4ProtoUDP<<8 | 0xFFFF<<16 | uint64(binary.LittleEndian.Uint32(s[:]))<<32 // TTL, header checksum (masked); source
	w2 = uint64(binary.LittleEndian.Uint32(d[:])) | be16(f.Src.Port())<<32 | be16(f.Dst.Port())<<48
	w3 = be16(uint16(udpLen)) | 0xFFFF<<16 // UDP length, checksum (masked)
	return w0, w1, w2, w3, true
}

// SealGather is Seal for a packet held in three pieces sent back to back:
// hdr (BTH and extension headers, at least a BTH), payload, and trailer
// (the pad bytes, then the 4-byte ICRC slot, which it fills in). The ICRC
// is the one Seal computes for the joined packet; payload is only read.
func (f Flow) SealGather(hdr, payload, trailer []byte) {
	if len(hdr) < BTHLen || len(trailer) < ICRCLen {
		return
	}
	total := len(hdr) + len(payload) + len(trailer)
	n := len(trailer) - ICRCLen
	if w0, w1, w2, w3, ok := f.words4(8 + total); ok {
		w3 |= le32(hdr) << 32
		w4 := le64(hdr[4:]) | 0xFF // FECN, BECN, resv6
		if foldable(len(payload)) {
			blk := [8]uint64{w0, w1, w2, w3, w4}
			if crc, ok := foldBlock(&blk, 40, hdr, payload, trailer[:n]); ok {
				binary.LittleEndian.PutUint32(trailer[n:], crc)
				return
			}
		}
		crc := slicing8Update(^headerReg4(w0, w1, w2, w3, w4), hdr[BTHLen:])
		crc = crc32.Update(crc, ieee, payload)
		crc = crc32.Update(crc, ieee, trailer[:n])
		binary.LittleEndian.PutUint32(trailer[n:], crc)
		return
	}
	var ip ipHeaderBuf
	var udp [8]byte
	h := f.headers(&ip, &udp, total)
	if foldable(len(payload)) {
		if crc, ok := icrcFold(h, udp[:], hdr, payload, trailer[:n]); ok {
			binary.LittleEndian.PutUint32(trailer[n:], crc)
			return
		}
	}
	crc := ICRC(h, udp[:], hdr)
	crc = crc32.Update(crc, ieee, payload)
	crc = crc32.Update(crc, ieee, trailer[:n])
	binary.LittleEndian.PutUint32(trailer[n:], crc)
}

// Verify checks the ICRC of pkt (a whole UDP payload) received on flow f
// (f.Src is the sender) when the IP header itself was not seen, as on a
// UDP socket. For IPv6 every ICRC-covered field is known and the check is
// the full 32-bit CRC; the returned ID is 0.
//
// For IPv4 the sender's Identification field is unknown: rdma_rxe puts the
// kernel's per-destination counter there. The CRC is affine over GF(2), so
// Verify computes the ICRC with ID 0, maps the 32-bit difference to the
// register position just after the ID field, and solves the 16 unknown ID
// bits with a precomputed echelon basis; the remaining 16 bits must then
// vanish. It tries DF set first (what Linux and rxe send) and then DF
// clear. It returns the solved ID. Strength: a corrupted packet passes
// with probability about 2^-16 per hypothesis, 2^-15 for both, against the
// 2^-32 of a full check; a change confined to the ID field is, by
// construction, never detected. Errors CRC-32 always detects (e.g. bursts
// up to 32 bits) are no longer guaranteed to be caught.
func (f Flow) Verify(pkt []byte) (Verdict, uint16) {
	v, id, _ := f.VerifyIPv4(pkt)
	return v, id
}

// VerifyIPv4 is Verify that also tells which DF hypothesis the ICRC
// verified under: dfClear when only the sender's header with DF clear
// explains it (a sender other than Linux and rxe, which set DF). Whoever
// rebuilds the header the packet came with (the pcap recorder) needs both
// the ID and the flag, or the rebuilt header fails the ICRC. IPv6 (no ID,
// no DF) returns 0 and false.
func (f Flow) VerifyIPv4(pkt []byte) (v Verdict, id uint16, dfClear bool) {
	if len(pkt) < BTHLen+ICRCLen || !f.valid() {
		return ICRCUnverifiable, 0, false
	}
	n := len(pkt) - ICRCLen
	got := binary.LittleEndian.Uint32(pkt[n:])
	delta := f.icrc(pkt[:n]) ^ got
	if delta == 0 {
		return ICRCOK, 0, false
	}
	if !f.IsIPv4() { // IPv6: every covered field is known
		return ICRCBad, 0, false
	}
	// Bytes covered after the ID field: the rest of the IPv4 header (14),
	// the UDP header (8) and the packet without its ICRC.
	e := unadvance(delta, 14+8+n)
	if id, ok := solveID(e); ok {
		return ICRCOK, id, false
	}
	if id, ok := solveID(e ^ dfFlip); ok {
		return ICRCOK, id, true
	}
	return ICRCBad, 0, false
}
