package wire

import "encoding/binary"

// ImmDt is a view of the 4-byte Immediate Data header.
type ImmDt []byte

// Imm returns the immediate data as the big-endian number on the wire.
// (libibverbs' imm_data is __be32: the same four bytes.)
func (h ImmDt) Imm() uint32 { return binary.BigEndian.Uint32(h) }

// SetImm sets the immediate data.
func (h ImmDt) SetImm(v uint32) { binary.BigEndian.PutUint32(h, v) }
