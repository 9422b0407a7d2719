package allreduce

import "unsafe"

// f32bytes views v's memory as bytes (little endian on every platform
// rxed runs on), for registering and sending without a copy.
func f32bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*4)
}

func uintptrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }
