package wire

import "encoding/binary"

// RETH is a view of the 16-byte RDMA Extended Transport Header:
// virtual address (8), R_Key (4), DMA length (4).
type RETH []byte

// VA returns the remote virtual address.
func (h RETH) VA() uint64 { return binary.BigEndian.Uint64(h[0:]) }

// SetVA sets the remote virtual address.
func (h RETH) SetVA(v uint64) { binary.BigEndian.PutUint64(h[0:], v) }

// RKey returns the remote key.
func (h RETH) RKey() uint32 { return binary.BigEndian.Uint32(h[8:]) }

// SetRKey sets the remote key.
func (h RETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(h[8:], v) }

// DMALen returns the length of the whole RDMA operation in bytes.
func (h RETH) DMALen() uint32 { return binary.BigEndian.Uint32(h[12:]) }

// SetDMALen sets the DMA length.
func (h RETH) SetDMALen(v uint32) { binary.BigEndian.PutUint32(h[12:], v) }
