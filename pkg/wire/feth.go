package wire

import "encoding/binary"

// FETH is a view of the 4-byte Flush Extended Transport Header (IBA 1.5
// memory placement extensions, rdma_rxe's struct rxe_feth): bits 3-0 are
// the placement type, bits 5-4 the selectivity level.
type FETH []byte

// Placement type bits (rxe's IB_FLUSH_GLOBAL / IB_FLUSH_PERSISTENT).
const (
	FlushGlobal     = 1
	FlushPersistent = 2
)

// Selectivity levels (rxe's IB_FLUSH_RANGE / IB_FLUSH_MR).
const (
	FlushRange = 0
	FlushMR    = 1
)

// Bits returns the whole 32-bit field.
func (h FETH) Bits() uint32 { return binary.BigEndian.Uint32(h) }

// SetBits sets the whole 32-bit field.
func (h FETH) SetBits(v uint32) { binary.BigEndian.PutUint32(h, v) }

// PlacementType returns bits 3-0.
func (h FETH) PlacementType() uint8 { return uint8(h.Bits() & 0x0F) }

// Selectivity returns bits 5-4.
func (h FETH) Selectivity() uint8 { return uint8(h.Bits()>>4) & 3 }

// Set sets the placement type and selectivity level, clearing other bits.
func (h FETH) Set(placement, selectivity uint8) {
	h.SetBits(uint32(placement&0x0F) | uint32(selectivity&3)<<4)
}
