package mad

import (
	"fmt"
	"net/netip"
)

// Helpers shared by the message codecs: 24-bit integers, bit-field range
// checks, private data areas and GIDs.

// MaxQPN is the largest 24-bit QPN, EECN or PSN.
const MaxQPN = 1<<24 - 1

// GIDLen is the size of a GID.
const GIDLen = 16

func be24(b []byte) uint32 { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }

func put24(b []byte, v uint32) { b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v) }

func b2u(v bool) uint8 {
	if v {
		return 1
	}
	return 0
}

// checkBits reports an ErrBadField error when v does not fit width bits.
func checkBits(msg, field string, v uint32, width uint) error {
	if v>>width != 0 {
		return fmt.Errorf("%w: %s %s %#x does not fit %d bits", ErrBadField, msg, field, v, width)
	}
	return nil
}

// checkPrivate reports an ErrBadField error when p exceeds limit bytes.
func checkPrivate(msg string, p []byte, limit int) error {
	if len(p) > limit {
		return fmt.Errorf("%w: %s private data of %d bytes, at most %d", ErrBadField, msg, len(p), limit)
	}
	return nil
}

// cloneArea returns a copy of a fixed area of received data.
func cloneArea(b []byte) []byte { return append([]byte(nil), b...) }

// gidAt returns the GID at b as a 16-byte address (an IPv4-mapped GID
// stays ::ffff:a.b.c.d).
func gidAt(b []byte) netip.Addr { return netip.AddrFrom16([16]byte(b[:GIDLen])) }

// checkGID reports an ErrBadField error for an address with no GID form.
func checkGID(msg, field string, a netip.Addr) error {
	if !a.IsValid() {
		return fmt.Errorf("%w: %s %s is not set (use netip.IPv6Unspecified for a zero GID)", ErrBadField, msg, field)
	}
	return nil
}

// putGID writes a as a GID: IPv6 as is, IPv4 as ::ffff:a.b.c.d (RoCEv2's
// IPv4 GID form).
func putGID(b []byte, a netip.Addr) {
	g := a.As16()
	copy(b[:GIDLen], g[:])
}
