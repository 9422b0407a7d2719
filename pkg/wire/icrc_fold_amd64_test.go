//go:build amd64 && !purego

package wire

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// forEachFoldMode runs f with the vector pass and, where this CPU has it,
// without it too, so that both ICRC paths stay covered on a machine that
// takes the vector one. Tests using it must not run in parallel.
func forEachFoldMode(t *testing.T, f func(t *testing.T)) {
	was := canFold
	defer func() { canFold = was }()
	if was {
		t.Run("vector", f)
	} else {
		t.Log("no AVX-512 VPCLMULQDQ here: only the table path runs")
	}
	canFold = false
	t.Run("tables", f)
}

// requireFold skips a test of foldAVX512 itself on a CPU without AVX-512
// VPCLMULQDQ, CI or not: the vector pass is optional by design, and there
// ICRC takes the table path, which forEachFoldMode's tests cover.
func requireFold(t *testing.T) {
	if !canFold {
		t.Skip("no AVX-512 VPCLMULQDQ on this CPU: the vector pass cannot run here")
	}
}

// foldConst is the folding constant for x^n: x^n mod P, bit-reflected in
// 32 bits and shifted left by one, the form PCLMULQDQ needs for the
// reflected CRC (Intel's paper, section 5).
func foldConst(n int) uint64 {
	const p = 0x104C11DB7 // P, not reflected
	r := uint64(1)
	for range n {
		r <<= 1
		if r&(1<<32) != 0 {
			r ^= p
		}
	}
	var refl uint64
	for i := range 32 {
		refl |= (r >> i & 1) << (31 - i)
	}
	return refl << 1
}

// TestFoldConstants derives every constant foldAVX512 multiplies by from
// the polynomial: a wrong one would fold some lengths wrong, and this names
// which.
func TestFoldConstants(t *testing.T) {
	lanes := func(d int) [8]uint64 {
		var k [8]uint64
		for i := 0; i < 8; i += 2 {
			k[i], k[i+1] = foldConst(d+32), foldConst(d-32)
		}
		return k
	}
	require.Equal(t, lanes(2048), foldK.k2048, "2048-bit fold")
	require.Equal(t, lanes(512), foldK.k512, "512-bit fold")
	require.Equal(t, [2]uint64{foldConst(128 + 32), foldConst(128 - 32)}, foldK.k128, "128-bit fold")
	require.Equal(t, foldConst(64), foldK.k64, "x^64")
	// Barrett: P itself and floor(x^64 / P), each reflected in 33 bits.
	q := uint64(0)         // floor(x^64 / P) by long division over GF(2)
	rem := [2]uint64{0, 1} // x^64 as (low, high) 64-bit words
	for bit := 64; bit >= 32; bit-- {
		w, b := rem[bit/64], uint(bit%64)
		if w>>b&1 != 0 {
			q |= 1 << (bit - 32)
			// subtract P * x^(bit-32)
			const p = 0x104C11DB7
			sh := uint(bit - 32)
			lo, hi := uint64(p)<<sh, uint64(0)
			if sh > 31 {
				hi = uint64(p) >> (64 - sh)
			}
			rem[0] ^= lo
			rem[1] ^= hi
		}
	}
	refl33 := func(v uint64) uint64 {
		var r uint64
		for i := range 33 {
			r |= (v >> i & 1) << (32 - i)
		}
		return r
	}
	require.Equal(t, [2]uint64{refl33(0x104C11DB7), refl33(q)}, foldK.mu, "Barrett")
	// The assembly reads foldK at fixed offsets (its K* macros).
	require.Equal(t, []uintptr{0, 64, 128, 144, 160},
		[]uintptr{unsafe.Offsetof(foldK.k2048), unsafe.Offsetof(foldK.k512), unsafe.Offsetof(foldK.k128),
			unsafe.Offsetof(foldK.k64), unsafe.Offsetof(foldK.mu)}, "foldK's layout against icrc_fold_amd64.s")
}

// TestFoldAVX512Paths runs the vector pass itself over every length of p
// (multiples of 16) up to past two rounds of the four accumulators, from
// random registers, against hash/crc32 over the same bytes.
func TestFoldAVX512Paths(t *testing.T) {
	requireFold(t)
	rng := rand.New(rand.NewPCG(2, 71))
	buf := make([]byte, 64+1200)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	var first [8]uint64
	for i := range first {
		first[i] = le64(buf[8*i:])
	}
	for n := 0; n <= 1200-16; n += 16 {
		reg := rng.Uint32()
		want := ^crc32.Update(^reg, crc32.IEEETable, buf[:64+n])
		require.Equal(t, want, foldAVX512(reg, &first, buf[64:64+n]), "len(p) %d", n)
	}
}
