package mr

import (
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// newTestTable returns a table with a seeded key source so failures are
// reproducible.
func newTestTable(t testing.TB, opts ...TableOption) *Table {
	t.Helper()
	return NewTable(rand.NewChaCha8([32]byte{1, 2, 3}), opts...)
}

func mustPD(t testing.TB, tb *Table) *PD {
	t.Helper()
	pd, err := tb.AllocPD()
	require.NoError(t, err)
	return pd
}

// alignedBuf returns n bytes starting at an 8-byte aligned address, inside a
// larger allocation so that bytes just outside exist.
func alignedBuf(n int) []byte {
	backing := make([]uint64, (n+7)/8+4)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&backing[2])), n)
	return b
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

func samePtr(a, b []byte) bool { return unsafe.SliceData(a) == unsafe.SliceData(b) }
