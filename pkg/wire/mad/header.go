package mad

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// Header is the 24-byte common MAD header (IBA 13.4.3), big-endian:
//
//	0: BaseVersion | 1: MgmtClass | 2: ClassVersion | 3: R(1) Method(7)
//	4-5: Status | 6-7: ClassSpecific | 8-15: TransactionID
//	16-17: AttributeID | 18-19: reserved | 20-23: AttributeModifier
//
// The response bit R is part of Method here (CM methods have it clear).
type Header struct {
	BaseVersion   uint8
	MgmtClass     uint8
	ClassVersion  uint8
	Method        uint8
	Status        uint16
	ClassSpecific uint16
	TID           uint64
	AttrID        uint16
	AttrMod       uint32
}

const (
	hdrBaseVersion   = 0
	hdrMgmtClass     = 1
	hdrClassVersion  = 2
	hdrMethod        = 3
	hdrStatus        = 4
	hdrClassSpecific = 6
	hdrTID           = 8
	hdrAttrID        = 16
	hdrReserved      = 18
	hdrAttrMod       = 20
)

// ParseHeader decodes the common header at the start of b, which must hold
// at least HeaderLen bytes (normally the whole MAD). It checks nothing
// else: Parse checks that the header is a CM one.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, fmt.Errorf("%w: MAD header of %d bytes, want %d", ErrTruncated, len(b), HeaderLen)
	}
	return Header{
		BaseVersion:   b[hdrBaseVersion],
		MgmtClass:     b[hdrMgmtClass],
		ClassVersion:  b[hdrClassVersion],
		Method:        b[hdrMethod],
		Status:        binary.BigEndian.Uint16(b[hdrStatus:]),
		ClassSpecific: binary.BigEndian.Uint16(b[hdrClassSpecific:]),
		TID:           binary.BigEndian.Uint64(b[hdrTID:]),
		AttrID:        binary.BigEndian.Uint16(b[hdrAttrID:]),
		AttrMod:       binary.BigEndian.Uint32(b[hdrAttrMod:]),
	}, nil
}

// Append appends the HeaderLen-byte encoding of h, reserved bytes zero.
func (h Header) Append(b []byte) []byte {
	n := len(b)
	b = slices.Grow(b, HeaderLen)[:n+HeaderLen]
	d := b[n:]
	d[hdrBaseVersion] = h.BaseVersion
	d[hdrMgmtClass] = h.MgmtClass
	d[hdrClassVersion] = h.ClassVersion
	d[hdrMethod] = h.Method
	binary.BigEndian.PutUint16(d[hdrStatus:], h.Status)
	binary.BigEndian.PutUint16(d[hdrClassSpecific:], h.ClassSpecific)
	binary.BigEndian.PutUint64(d[hdrTID:], h.TID)
	binary.BigEndian.PutUint16(d[hdrAttrID:], h.AttrID)
	binary.BigEndian.PutUint16(d[hdrReserved:], 0)
	binary.BigEndian.PutUint32(d[hdrAttrMod:], h.AttrMod)
	return b
}

// checkCM checks the header fields every CM MAD shares, in the order a
// receiver (ib_mad's agent lookup, then cm.c) looks at them.
func (h Header) checkCM() error {
	switch {
	case h.BaseVersion != BaseVersion:
		return fmt.Errorf("%w: base version %d, want %d", ErrBadVersion, h.BaseVersion, BaseVersion)
	case h.MgmtClass != ClassCM:
		return fmt.Errorf("%w: management class %#02x, want %#02x", ErrBadClass, h.MgmtClass, ClassCM)
	case h.ClassVersion != CMClassVersion:
		return fmt.Errorf("%w: CM class version %d, want %d", ErrBadVersion, h.ClassVersion, CMClassVersion)
	case h.Method != MethodSend:
		return fmt.Errorf("%w: method %#02x, want SEND (%#02x)", ErrBadMethod, h.Method, MethodSend)
	}
	return nil
}
