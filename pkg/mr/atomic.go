package mr

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"unsafe"
)

// CompareSwap executes an IBA CmpSwap on the 8 bytes at mem[0:8] in host
// byte order (as rxe): if they equal cmp they become swap. It returns the
// original value. It is atomic against every other CompareSwap, FetchAdd
// and AtomicStore in the process on the same address, from any goroutine:
// aligned addresses use the CPU's atomics, unaligned ones a lock striped by
// address. (An unaligned and an aligned operation on overlapping but
// different addresses are not atomic with each other; the data path only
// issues aligned atomics - Lookup rejects the others with ErrAlign.)
func CompareSwap(mem []byte, cmp, swap uint64) (orig uint64) {
	p := addr8(mem)
	if uintptr(p)&7 == 0 {
		u := (*uint64)(p)
		for {
			old := atomic.LoadUint64(u)
			if old != cmp || atomic.CompareAndSwapUint64(u, old, swap) {
				return old
			}
		}
	}
	mu := stripe(p)
	mu.Lock()
	orig = binary.NativeEndian.Uint64(mem)
	if orig == cmp {
		binary.NativeEndian.PutUint64(mem, swap)
	}
	mu.Unlock()
	return orig
}

// FetchAdd executes an IBA FetchAdd on the 8 bytes at mem[0:8] in host
// byte order: they become their sum with add (mod 2^64). It returns the
// original value. Atomicity as for CompareSwap.
func FetchAdd(mem []byte, add uint64) (orig uint64) {
	p := addr8(mem)
	if uintptr(p)&7 == 0 {
		return atomic.AddUint64((*uint64)(p), add) - add
	}
	mu := stripe(p)
	mu.Lock()
	orig = binary.NativeEndian.Uint64(mem)
	binary.NativeEndian.PutUint64(mem, orig+add)
	mu.Unlock()
	return orig
}

// AtomicStore writes v to mem[0:8] in host byte order as one atomic store
// (the RDMA ATOMIC_WRITE operation), atomic as CompareSwap.
func AtomicStore(mem []byte, v uint64) {
	p := addr8(mem)
	if uintptr(p)&7 == 0 {
		atomic.StoreUint64((*uint64)(p), v)
		return
	}
	mu := stripe(p)
	mu.Lock()
	binary.NativeEndian.PutUint64(mem, v)
	mu.Unlock()
}

// AtomicLoad reads mem[0:8] in host byte order atomically with respect to
// the operations above.
func AtomicLoad(mem []byte) uint64 {
	p := addr8(mem)
	if uintptr(p)&7 == 0 {
		return atomic.LoadUint64((*uint64)(p))
	}
	mu := stripe(p)
	mu.Lock()
	v := binary.NativeEndian.Uint64(mem)
	mu.Unlock()
	return v
}

const numStripes = 64

// stripes serialise unaligned atomics; padded so that unrelated stripes do
// not share a cache line.
var stripes [numStripes]struct {
	sync.Mutex
	_ [64 - unsafe.Sizeof(sync.Mutex{})%64]byte
}

func stripe(p unsafe.Pointer) *sync.Mutex {
	a := uint64(uintptr(p))
	a ^= a >> 17
	a *= 0x9e3779b97f4a7c15
	return &stripes[a>>(64-6)].Mutex
}

// addr8 returns the address of mem's first byte after checking that mem
// holds 8 bytes (without reading them, which the race detector would flag).
func addr8(mem []byte) unsafe.Pointer {
	if len(mem) < 8 {
		panic("mr: atomic operand shorter than 8 bytes")
	}
	return unsafe.Pointer(unsafe.SliceData(mem))
}
