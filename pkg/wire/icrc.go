package wire

import (
	"encoding/binary"
	"hash/crc32"
	"math/bits"
	"sync/atomic"
)

// The ICRC is CRC-32 (IEEE 802.3, hash/crc32's IEEE polynomial) over eight
// bytes of 0xFF, the IP header, the UDP header and the BTH with the fields a
// router may change set to all ones (IPv4 TOS, TTL, header checksum; IPv6
// traffic class, flow label, hop limit; UDP checksum; BTH byte 4 with FECN,
// BECN and resv6), then the rest of the packet up to the ICRC. It is stored
// little-endian (rdma_rxe's rxe_icrc.c; RoCEv2 Annex A17.3.3).

var ieee = crc32.IEEETable

// icrcSmall is the packet size (without ICRC) up to which icrcGeneric
// copies the whole packet next to the masked headers and runs the CRC once.
const icrcSmall = 64

// maskHeaders writes the IP, UDP and BTH headers into d with the fields a
// router may change set to all ones, and returns the length written. Short
// or odd inputs are copied as far as they go (no panic): the result is then
// simply a wrong ICRC. d must hold 60+8+BTHLen bytes.
func maskHeaders(d, ip, udp, bth []byte) int {
	ip = ip[:min(len(ip), 60)]
	udp = udp[:min(len(udp), 8)]
	bth = bth[:min(len(bth), BTHLen)]
	n := copy(d, ip)
	if len(ip) >= 8 && ip[0]>>4 == 6 {
		d[0] |= 0x0F
		d[1], d[2], d[3] = 0xFF, 0xFF, 0xFF // traffic class, flow label
		d[7] = 0xFF                         // hop limit
	} else if len(ip) >= 12 && ip[0]>>4 == 4 {
		d[1] = 0xFF               // TOS
		d[8] = 0xFF               // TTL
		d[10], d[11] = 0xFF, 0xFF // header checksum
	}
	copy(d[n:], udp)
	if len(udp) == 8 {
		d[n+6], d[n+7] = 0xFF, 0xFF // UDP checksum
	}
	n += len(udp)
	copy(d[n:], bth)
	if len(bth) > 4 {
		d[n+4] = 0xFF // FECN, BECN, resv6
	}
	return n + len(bth)
}

var ff8 = [8]byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}

const icrcBufLen = 8 + 60 + 8 + BTHLen + icrcSmall

// ICRC computes the invariant CRC of a RoCEv2 packet. ipHdr is the IPv4 or
// IPv6 header exactly as on the wire (the version nibble selects the
// masking), udpHdr the 8-byte UDP header, roce the UDP payload without the
// trailing ICRC (BTH, extension headers, payload, pad).
func ICRC(ipHdr, udpHdr, roce []byte) uint32 {
	if len(roce) >= BTHLen && foldable(len(roce)-BTHLen) {
		if crc, ok := icrcFold(ipHdr, udpHdr, roce[:BTHLen], roce[BTHLen:], nil); ok {
			return crc
		}
	}
	if len(udpHdr) == 8 && len(roce) >= BTHLen {
		var st uint32
		switch ipFast(ipHdr) {
		case 4:
			st = prefixIPv4(ipHdr, udpHdr, roce)
		case 6:
			st = prefixIPv6(ipHdr, udpHdr, roce)
		default:
			return icrcGeneric(ipHdr, udpHdr, roce)
		}
		rest := roce[BTHLen:]
		if len(rest) < 64 {
			return slicing8Update(^st, rest)
		}
		// The long tail goes to hash/crc32's PCLMULQDQ path.
		return crc32.Update(^st, ieee, rest)
	}
	return icrcGeneric(ipHdr, udpHdr, roce)
}

// foldMin is the payload length from which ICRC runs the masked headers and
// the payload as one vector pass (icrcFold) where the CPU can.
const foldMin = 256

// foldable reports whether n bytes after the headers go to the vector pass.
func foldable(n int) bool { return n >= foldMin && canFold }

// ipFast returns 4 or 6 for an IP header the fast paths take (IPv4 without
// options, IPv6), 0 for any other.
func ipFast(ip []byte) int {
	switch {
	case len(ip) == 20 && ip[0] == 0x45:
		return 4
	case len(ip) == 40 && ip[0]>>4 == 6:
		return 6
	}
	return 0
}

// icrcFold computes the ICRC of a packet held as hdr (the BTH and any
// extension headers), body (at least foldMin bytes) and tail, with the
// masked IP, UDP and BTH headers, the extension headers and the start of
// body in one 64-byte block that foldAVX512 folds together with the rest of
// body. Unlike the headers' register followed by hash/crc32, nothing waits
// for a chain of table lookups before the vector pass starts: that wait is
// what held ICRC to 0.75x of hash/crc32 on a 4 KiB packet. ok is false for
// headers it does not take (IPv4 options, extension headers over the block).
func icrcFold(ip, udp, hdr, body, tail []byte) (crc uint32, ok bool) {
	if len(udp) != 8 || len(hdr) < BTHLen || !foldable(len(body)) {
		return 0, false
	}
	var blk [8]uint64
	var n int // bytes of blk filled
	switch ipFast(ip) {
	case 4:
		blk[0], blk[1], blk[2], blk[3], blk[4] = maskedIPv4(ip, udp, hdr)
		n = 40
	case 6:
		blk[0], blk[1], blk[2], blk[3], blk[4], blk[5], blk[6], blk[7] = maskedIPv6(ip, udp, hdr)
		n = 60
	default:
		return 0, false
	}
	return foldBlock(&blk, n, hdr, body, tail)
}

// foldBlock is icrcFold once the block's first n bytes hold the masked IP,
// UDP and BTH headers: it adds the extension headers and the start of
// body, and folds. ok is false when the extension headers do not fit.
func foldBlock(blk *[8]uint64, n int, hdr, body, tail []byte) (crc uint32, ok bool) {
	ext := hdr[BTHLen:]
	if n+len(ext) > len(blk)*8 {
		return 0, false
	}
	if len(ext) == 0 && n == 40 { // as received: the body follows the BTH
		blk[5], blk[6], blk[7] = le64(body), le64(body[8:]), le64(body[16:])
		body = body[24:]
	} else {
		var b [64]byte
		copy(b[n:], ext)
		body = body[copy(b[n+len(ext):], body):]
		for i := n / 8; i < len(blk); i++ {
			blk[i] |= le64(b[8*i:])
		}
	}
	whole := len(body) &^ 15
	crc = ^foldAVX512(regAfterFF, blk, body[:whole])
	return slicing8Update(slicing8Update(crc, body[whole:]), tail), true
}

// icrcGeneric handles IPv4 options and malformed input.
func icrcGeneric(ipHdr, udpHdr, roce []byte) uint32 {
	var buf [icrcBufLen]byte
	nb := min(len(roce), BTHLen)
	n := copy(buf[:], ff8[:])
	n += maskHeaders(buf[n:], ipHdr, udpHdr, roce[:nb])
	rest := roce[nb:]
	if len(rest) <= icrcSmall {
		n += copy(buf[n:], rest)
		return slicing8Update(0, buf[:n])
	}
	// The stack buffer is hashed here: handing it to crc32 (an indirect
	// call) would move it to the heap.
	return crc32.Update(slicing8Update(0, buf[:n]), ieee, rest)
}

// The fast paths below run slicing-by-8 over the masked headers straight
// from the input, eight bytes (one little-endian word) at a time, with the
// mask ORed in: no copy, and the ICRC stays within 10-20% of plain crc32.
// They return the raw CRC register (not complemented).

// regAfterFF is the CRC register after the eight 0xFF bytes.
var regAfterFF = ^slicing8Update(0, ff8[:])

func step8(r uint32, w uint64) uint32 {
	t := &slicing8
	r ^= uint32(w)
	return t[0][byte(w>>56)] ^ t[1][byte(w>>48)] ^ t[2][byte(w>>40)] ^ t[3][byte(w>>32)] ^
		t[4][r>>24] ^ t[5][byte(r>>16)] ^ t[6][byte(r>>8)] ^ t[7][byte(r)]
}

func le64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }
func le32(b []byte) uint64 { return uint64(binary.LittleEndian.Uint32(b)) }

// maskedIPv4 returns the IPv4, UDP and BTH headers (40 bytes) as five
// little-endian words with the ICRC's mask ORed in. Five results, not an
// array: they stay in registers.
func maskedIPv4(ip, udp, bth []byte) (w0, w1, w2, w3, w4 uint64) {
	return le64(ip[0:]) | 0xFF<<8, // TOS
		le64(ip[8:]) | 0xFF | 0xFFFF<<16, // TTL, checksum
		le32(ip[16:]) | le32(udp[0:])<<32, // dst, ports
		le32(udp[4:]) | 0xFFFF<<16 | le32(bth)<<32, // UDP checksum
		le64(bth[4:]) | 0xFF // FECN, BECN, resv6
}

// maskedIPv6 is maskedIPv4 for IPv6: seven words, and the last four bytes
// of the BTH (unmasked) in w7 (60 bytes in all).
func maskedIPv6(ip, udp, bth []byte) (w0, w1, w2, w3, w4, w5, w6, w7 uint64) {
	return le64(ip[0:]) | 0x0F | 0xFFFFFF<<8 | 0xFF<<56, // TC, flow label, hop limit
		le64(ip[8:]), le64(ip[16:]), le64(ip[24:]), le64(ip[32:]),
		le64(udp) | 0xFFFF<<48, // UDP checksum
		le64(bth) | 0xFF<<32, // FECN, BECN, resv6
		le32(bth[8:])
}

func prefixIPv4(ip, udp, bth []byte) uint32 {
	_, _, _ = ip[19], udp[7], bth[11]
	return headerReg4(maskedIPv4(ip, udp, bth))
}

// headerReg4 is the register after the eight 0xFF bytes and the five
// masked header words of an IPv4 packet.
func headerReg4(w0, w1, w2, w3, w4 uint64) uint32 {
	return step8(step8(step8(step8(step8(regAfterFF, w0), w1), w2), w3), w4)
}

func prefixIPv6(ip, udp, bth []byte) uint32 {
	_, _, _ = ip[39], udp[7], bth[11]
	w0, w1, w2, w3, w4, w5, w6, w7 := maskedIPv6(ip, udp, bth)
	r := step8(step8(step8(step8(step8(step8(step8(regAfterFF, w0), w1), w2), w3), w4), w5), w6)
	t := &slicing8[0]
	for range 4 {
		r = t[byte(r)^byte(w7)] ^ r>>8
		w7 >>= 8
	}
	return r
}

// slicing8 holds the slicing-by-8 tables (what hash/crc32 itself uses for
// inputs under 64 bytes).
// It is a variable initialiser, not init(), because regAfterFF needs it
// during package variable initialisation.
var slicing8 = func() (t [8][256]uint32) {
	t[0] = *ieee
	for i := range 256 {
		c := t[0][i]
		for j := 1; j < 8; j++ {
			c = t[0][c&0xFF] ^ c>>8
			t[j][i] = c
		}
	}
	return t
}()

// slicing8Update is crc32.Update(crc, IEEETable, p) for short p, inlined
// here so that p may live on the caller's stack.
func slicing8Update(crc uint32, p []byte) uint32 {
	crc = ^crc
	t := &slicing8
	for len(p) >= 8 {
		crc ^= binary.LittleEndian.Uint32(p)
		crc = t[0][p[7]] ^ t[1][p[6]] ^ t[2][p[5]] ^ t[3][p[4]] ^
			t[4][crc>>24] ^ t[5][crc>>16&0xFF] ^ t[6][crc>>8&0xFF] ^ t[7][crc&0xFF]
		p = p[8:]
	}
	for _, v := range p {
		crc = t[0][byte(crc)^v] ^ crc>>8
	}
	return ^crc
}

// VerifyICRC checks the ICRC of pkt (a whole UDP payload, ICRC included)
// against the IP and UDP headers it arrived with.
func VerifyICRC(ipHdr, udpHdr, pkt []byte) Verdict {
	if len(pkt) < BTHLen+ICRCLen {
		return ICRCUnverifiable
	}
	n := len(pkt) - ICRCLen
	if ICRC(ipHdr, udpHdr, pkt[:n]) == binary.LittleEndian.Uint32(pkt[n:]) {
		return ICRCOK
	}
	return ICRCBad
}

// Verdict is the outcome of an ICRC check.
type Verdict uint8

// ICRC verdicts. The zero value is ICRCUnverifiable so that an unset
// verdict never reads as success.
const (
	ICRCUnverifiable Verdict = iota // not enough information (or too short) to check
	ICRCOK
	ICRCBad
)

// String returns "ok", "bad" or "unverifiable".
func (v Verdict) String() string {
	switch v {
	case ICRCOK:
		return "ok"
	case ICRCBad:
		return "bad"
	}
	return "unverifiable"
}

// --- GF(2) arithmetic on CRC registers -------------------------------------
//
// A 32-bit register r stands for a polynomial of degree < 32 with the x^0
// coefficient in bit 31 (the reflected convention of hash/crc32 and zlib).
// Running the CRC over k zero bytes multiplies the (linear part of the)
// register by x^(8k) mod P. Differences of two CRCs over same-length
// messages are purely linear, which is what lets Flow.Verify solve for an
// unseen IPv4 Identification field.

const (
	polyIEEE = 0xEDB88320
	gfOne    = 1 << 31 // the polynomial 1
	gfX      = 1 << 30 // the polynomial x
)

// gfMul returns a*b mod P.
func gfMul(a, b uint32) uint32 {
	var p uint32
	for m := uint32(gfOne); a != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
			a &^= m
		}
		if b&1 != 0 {
			b = b>>1 ^ polyIEEE
		} else {
			b >>= 1
		}
	}
	return p
}

// gfDivX returns r / x mod P: one zero bit run backwards. It exists because
// P has a non-zero constant term, so x is invertible.
func gfDivX(r uint32) uint32 {
	if r&gfOne != 0 {
		return (r^polyIEEE)<<1 | 1
	}
	return r << 1
}

// invPow8[k] = x^(-8*2^k) mod P.
var invPow8 [24]uint32

func init() {
	r := uint32(gfOne)
	for range 8 {
		r = gfDivX(r)
	}
	invPow8[0] = r
	for k := 1; k < len(invPow8); k++ {
		invPow8[k] = gfMul(invPow8[k-1], invPow8[k-1])
	}
}

// unadvance returns the register r run backwards over n zero bytes.
func unadvance(r uint32, n int) uint32 { return gfMul(invPowBytes(n), r) }

// invPowCache remembers x^(-8n) mod P for recently seen lengths n: a
// receiver sees few distinct packet sizes (MTU-sized and ACKs), and the
// square-and-multiply costs about a dozen GF(2) multiplications. Each slot
// packs n<<32 | value into one atomic word, so a racing reader sees either
// a complete entry or a miss, never a torn one.
var invPowCache [64]atomic.Uint64

// invPowBytes returns x^(-8n) mod P (n < 2^23).
func invPowBytes(n int) uint32 {
	slot := &invPowCache[n&63]
	if e := slot.Load(); e>>32 == uint64(n)+1 {
		return uint32(e)
	}
	r := uint32(gfOne)
	for k, m := 0, n; m != 0 && k < len(invPow8); k++ {
		if m&1 != 0 {
			r = gfMul(invPow8[k], r)
		}
		m >>= 1
	}
	slot.Store((uint64(n)+1)<<32 | uint64(r))
	return r
}

// lin2 is the linear register contribution of two bytes hi, lo fed into a
// zero register.
func lin2(hi, lo byte) uint32 {
	s := ieee[hi]
	return ieee[byte(s)^lo] ^ s>>8
}

// idBasis is an echelon basis of the 16-dimensional space {lin2(id)}: each
// vec's highest set bit (its pivot) is unique, and tag is the ID it is the
// image of. Sorted by descending pivot.
type idBasisVec struct {
	vec uint32
	tag uint16
}

var idBasis [16]idBasisVec

// dfFlip is the effect of toggling the IPv4 DF bit, expressed at the
// register position right after the Identification field.
var dfFlip uint32

func init() {
	n := 0
	for i := range 16 {
		bit := uint16(1) << i
		v := lin2(byte(bit>>8), byte(bit))
		tag := bit
		for _, b := range idBasis[:n] {
			if v&(1<<(31-bits.LeadingZeros32(b.vec))) != 0 {
				v ^= b.vec
				tag ^= b.tag
			}
		}
		if v == 0 {
			panic("wire: CRC of a 16-bit field is not injective") // cannot happen: deg P = 32
		}
		// insert keeping descending pivots
		k := n
		for k > 0 && bits.LeadingZeros32(idBasis[k-1].vec) > bits.LeadingZeros32(v) {
			idBasis[k] = idBasis[k-1]
			k--
		}
		idBasis[k] = idBasisVec{v, tag}
		n++
	}
	dfFlip = unadvance(lin2(0x40, 0x00), 2)
}

// solveID returns the ID whose lin2 image is e, if there is one.
func solveID(e uint32) (uint16, bool) {
	var id uint16
	for _, b := range idBasis {
		if e&(1<<(31-bits.LeadingZeros32(b.vec))) != 0 {
			e ^= b.vec
			id ^= b.tag
		}
	}
	return id, e == 0
}
