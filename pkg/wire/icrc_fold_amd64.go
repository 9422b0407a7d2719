//go:build amd64 && !purego

package wire

import "golang.org/x/sys/cpu"

// canFold says foldAVX512 may run: it needs AVX-512 with its carry-less
// multiply (VPCLMULQDQ) and, for the last steps, PCLMULQDQ and SSE4.1. The
// cpu package reports AVX-512 only where the OS saves its registers.
var canFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VPCLMULQDQ &&
	cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE41

// foldK holds the constants foldAVX512 multiplies by, as in Intel's "Fast
// CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction"
// (2009) for the bit-reflected CRC-32: to move a 128-bit lane D bits on, its
// low quadword is multiplied by x^(D+32) mod P and its high one by
// x^(D-32) mod P, each bit-reflected and shifted left by one (foldConst).
// TestFoldConstants derives every value from the polynomial.
var foldK = struct {
	k2048 [8]uint64 // D = 2048: four 512-bit accumulators, 256 bytes a step
	k512  [8]uint64 // D = 512: one 512-bit accumulator, 64 bytes a step
	k128  [2]uint64 // D = 128: one lane into the next
	k64   uint64    // x^64 mod P: 128 bits down to 64
	_     uint64
	mu    [2]uint64 // P and floor(x^64 / P), reflected: Barrett's reduction
}{
	k2048: [8]uint64{0x11542778a, 0x1322d1430, 0x11542778a, 0x1322d1430, 0x11542778a, 0x1322d1430, 0x11542778a, 0x1322d1430},
	k512:  [8]uint64{0x154442bd4, 0x1c6e41596, 0x154442bd4, 0x1c6e41596, 0x154442bd4, 0x1c6e41596, 0x154442bd4, 0x1c6e41596},
	k128:  [2]uint64{0x1751997d0, 0x0ccaa009e},
	k64:   0x163cd6124,
	mu:    [2]uint64{0x1db710641, 0x1f7011641},
}

// foldAVX512 is in icrc_fold_amd64.s.
//
//go:noescape
func foldAVX512(reg uint32, first *[8]uint64, p []byte) uint32
