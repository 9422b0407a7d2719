package wire

import "encoding/binary"

// DETH is a view of the 8-byte Datagram Extended Transport Header:
// Q_Key (4), reserved (1), source QP (3).
type DETH []byte

// QKey returns the queue key.
func (h DETH) QKey() uint32 { return binary.BigEndian.Uint32(h[0:]) }

// SetQKey sets the queue key.
func (h DETH) SetQKey(v uint32) { binary.BigEndian.PutUint32(h[0:], v) }

// Reserved returns the reserved byte.
func (h DETH) Reserved() uint8 { return h[4] }

// SrcQP returns the 24-bit source QP number.
func (h DETH) SrcQP() uint32 { return be24(h[5:]) }

// SetSrcQP sets the source QP number (low 24 bits).
func (h DETH) SetSrcQP(v uint32) { putBE24(h[5:], v) }
