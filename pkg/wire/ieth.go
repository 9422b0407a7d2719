package wire

import "encoding/binary"

// IETH is a view of the 4-byte Invalidate Extended Transport Header.
type IETH []byte

// RKey returns the R_Key the responder must invalidate.
func (h IETH) RKey() uint32 { return binary.BigEndian.Uint32(h) }

// SetRKey sets the R_Key to invalidate.
func (h IETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(h, v) }
