package wire

import "encoding/binary"

// AtomicAckETH is a view of the 8-byte Atomic Acknowledge Extended
// Transport Header: the original remote data.
type AtomicAckETH []byte

// OrigData returns the value the target held before the atomic operation.
func (h AtomicAckETH) OrigData() uint64 { return binary.BigEndian.Uint64(h) }

// SetOrigData sets the original remote data.
func (h AtomicAckETH) SetOrigData(v uint64) { binary.BigEndian.PutUint64(h, v) }
