package wire

import "encoding/binary"

// AtomicETH is a view of the 28-byte Atomic Extended Transport Header:
// VA (8), R_Key (4), swap or add data (8), compare data (8).
type AtomicETH []byte

// VA returns the remote virtual address (8-byte aligned on valid requests).
func (h AtomicETH) VA() uint64 { return binary.BigEndian.Uint64(h[0:]) }

// SetVA sets the remote virtual address.
func (h AtomicETH) SetVA(v uint64) { binary.BigEndian.PutUint64(h[0:], v) }

// RKey returns the remote key.
func (h AtomicETH) RKey() uint32 { return binary.BigEndian.Uint32(h[8:]) }

// SetRKey sets the remote key.
func (h AtomicETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(h[8:], v) }

// SwapAdd returns the swap (COMPARE_SWAP) or add (FETCH_ADD) operand.
func (h AtomicETH) SwapAdd() uint64 { return binary.BigEndian.Uint64(h[12:]) }

// SetSwapAdd sets the swap or add operand.
func (h AtomicETH) SetSwapAdd(v uint64) { binary.BigEndian.PutUint64(h[12:], v) }

// Compare returns the compare operand (COMPARE_SWAP only).
func (h AtomicETH) Compare() uint64 { return binary.BigEndian.Uint64(h[20:]) }

// SetCompare sets the compare operand.
func (h AtomicETH) SetCompare(v uint64) { binary.BigEndian.PutUint64(h[20:], v) }
