package wire

import (
	"encoding/binary"
	"hash/crc32"
	"math/bits"
)

// The ICRC is CRC-32 (IEEE 802.3, hash/crc32's IEEE polynomial) over eight
// bytes of 0xFF, the IP header, the UDP header and the BTH with the fields a
// router may change set to all ones (IPv4 TOS, TTL, header checksum; IPv6
// traffic class, flow label, hop limit; UDP checksum; BTH byte 4 with FECN,
// BECN and resv6), then the rest of the packet up to the ICRC. It is stored
// little-endian (rdma_rxe's rxe_icrc.c; RoCEv2 Annex A17.3.3).

var ieee = crc32.IEEETable

// stateAfterFF is the CRC register after the eight 0xFF bytes, starting
// from the usual all-ones initial register. The arithmetic below works on
// the raw register (Go's CRC values are its complement).
var stateAfterFF = func() uint32 {
	s := ^uint32(0)
	for range 8 {
		s = ieee[byte(s)^0xFF] ^ s>>8
	}
	return s
}()

func feed(s uint32, b []byte) uint32 {
	for _, c := range b {
		s = ieee[byte(s)^c] ^ s>>8
	}
	return s
}

func feedFF(s uint32, n int) uint32 {
	for range n {
		s = ieee[byte(s)^0xFF] ^ s>>8
	}
	return s
}

// maskedHeaders runs the CRC register over the masked IP, UDP and BTH
// headers. Short inputs are fed as far as they go (no panic): the result is
// then simply a wrong ICRC.
func maskedHeaders(ip, udp, bth []byte) uint32 {
	s := stateAfterFF
	if len(ip) > 0 && ip[0]>>4 == 6 {
		if len(ip) >= 8 {
			s = feed(s, []byte{ip[0] | 0x0F})
			s = feedFF(s, 3) // traffic class, flow label
			s = feed(s, ip[4:7])
			s = feedFF(s, 1) // hop limit
			s = feed(s, ip[8:])
		} else {
			s = feed(s, ip)
		}
	} else if len(ip) >= 12 {
		s = feed(s, ip[:1])
		s = feedFF(s, 1) // TOS
		s = feed(s, ip[2:8])
		s = feedFF(s, 1) // TTL
		s = feed(s, ip[9:10])
		s = feedFF(s, 2) // header checksum
		s = feed(s, ip[12:])
	} else {
		s = feed(s, ip)
	}
	if len(udp) >= 8 {
		s = feed(s, udp[:6])
		s = feedFF(s, 2) // UDP checksum
		s = feed(s, udp[8:])
	} else {
		s = feed(s, udp)
	}
	if len(bth) >= 5 {
		s = feed(s, bth[:4])
		s = feedFF(s, 1) // FECN, BECN, resv6
		s = feed(s, bth[5:])
	} else {
		s = feed(s, bth)
	}
	return s
}

// ICRC computes the invariant CRC of a RoCEv2 packet. ipHdr is the IPv4 or
// IPv6 header exactly as on the wire (the version nibble selects the
// masking), udpHdr the 8-byte UDP header, roce the UDP payload without the
// trailing ICRC (BTH, extension headers, payload, pad).
func ICRC(ipHdr, udpHdr, roce []byte) uint32 {
	n := min(len(roce), BTHLen)
	s := maskedHeaders(ipHdr, udpHdr, roce[:n])
	// crc32.Update expects the complemented form and uses the accelerated
	// (slicing / PCLMULQDQ) path for the long tail.
	return crc32.Update(^s, ieee, roce[n:])
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
func unadvance(r uint32, n int) uint32 {
	for k := 0; n != 0 && k < len(invPow8); k++ {
		if n&1 != 0 {
			r = gfMul(invPow8[k], r)
		}
		n >>= 1
	}
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
