package qp

import "fmt"

// PSN is an InfiniBand packet sequence number: 24 bits that wrap around.
//
// Comparisons are made in a window of 2^23 either side, the way gVisor's
// seqnum compares TCP sequence numbers, so that "before" and "after" stay
// meaningful across the wrap from 0xFFFFFF to 0. The upper 8 bits of the
// underlying uint32 are always zero for values produced by this package;
// use NewPSN to turn an arbitrary uint32 into a PSN.
type PSN uint32

const (
	// PSNMask selects the 24 significant bits of a PSN.
	PSNMask = 1<<24 - 1
	// PSNHalfSpace is the largest distance at which two PSNs are still
	// ordered: a PSN more than this far ahead is considered behind.
	PSNHalfSpace = 1 << 23
)

// NewPSN returns v truncated to 24 bits.
func NewPSN(v uint32) PSN { return PSN(v & PSNMask) }

// Valid reports whether p fits in 24 bits.
func (p PSN) Valid() bool { return p <= PSNMask }

// Add returns p advanced by n, modulo 2^24.
func (p PSN) Add(n uint32) PSN { return PSN((uint32(p) + n) & PSNMask) }

// Sub returns p moved back by n, modulo 2^24.
func (p PSN) Sub(n uint32) PSN { return PSN((uint32(p) - n) & PSNMask) }

// Next returns the PSN after p.
func (p PSN) Next() PSN { return p.Add(1) }

// Prev returns the PSN before p.
func (p PSN) Prev() PSN { return p.Sub(1) }

// Diff returns the signed distance p - q, in [-2^23, 2^23).
// A positive result means p is after q.
func (p PSN) Diff(q PSN) int32 {
	d := (uint32(p) - uint32(q)) & PSNMask
	if d >= PSNHalfSpace {
		return int32(d) - 1<<24
	}
	return int32(d)
}

// Less reports whether p comes strictly before q.
func (p PSN) Less(q PSN) bool { return p.Diff(q) < 0 }

// LessEq reports whether p comes before q or equals it.
func (p PSN) LessEq(q PSN) bool { return p.Diff(q) <= 0 }

// InRange reports whether first <= p < end, in wrap-around order.
func (p PSN) InRange(first, end PSN) bool {
	return first.LessEq(p) && p.Less(end)
}

// InWindow reports whether p lies in the size PSNs starting at first,
// that is first <= p < first+size. Unlike Less it does not depend on the
// half-space rule, so it is exact for any size up to 2^24.
func (p PSN) InWindow(first PSN, size uint32) bool {
	return (uint32(p)-uint32(first))&PSNMask < size
}

// Uint32 returns p as a plain number.
func (p PSN) Uint32() uint32 { return uint32(p) }

// String formats p as six hexadecimal digits, as rxe's debug output does.
func (p PSN) String() string { return fmt.Sprintf("%#06x", uint32(p)) }
