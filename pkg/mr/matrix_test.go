package mr

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"testing"

	"github.com/stretchr/testify/require"
)

// op is one data-path operation of the matrix.
type op struct {
	name string
	kind KeyKind
	need Access
}

var matrixOps = []op{
	{"local-read", LKey, 0},
	{"local-write", LKey, LocalWrite},
	{"remote-read", RKey, RemoteRead},
	{"remote-write", RKey, RemoteWrite},
	{"remote-atomic", RKey, RemoteAtomic},
}

// inRange128 decides [va, va+length) ⊆ [iova, iova+n) with 128-bit
// arithmetic, independently of the implementation's overflow handling.
func inRange128(va, length, iova, n uint64) bool {
	endLo, endHi := bits.Add64(va, length, 0)
	limLo, limHi := bits.Add64(iova, n, 0)
	if va < iova {
		return false
	}
	return endHi < limHi || (endHi == limHi && endLo <= limLo)
}

// expectLookup is the IBA answer for the matrix, written from the rules
// (C9-88 zero-length, key/PD/access checks, naturally aligned atomics), not
// from the implementation.
func expectLookup(access Access, o op, va, length, iova, n uint64, rightPD, liveKey bool) error {
	atomic := o.need&RemoteAtomic != 0
	if length == 0 && !atomic {
		return nil
	}
	if atomic && length != 8 {
		return ErrRange
	}
	if !liveKey {
		return ErrInvalidKey
	}
	if !rightPD {
		return ErrPDMismatch
	}
	if access&o.need != o.need {
		return ErrAccess
	}
	if !inRange128(va, length, iova, n) {
		return ErrRange
	}
	if atomic && va%8 != 0 {
		return ErrAlign
	}
	return nil
}

type rangeCase struct {
	name       string
	va, length uint64
}

// rangeCases returns accesses around a region [iova, iova+n), including
// the edges and the values that overflow naive arithmetic.
func rangeCases(iova, n uint64) []rangeCase {
	return []rangeCase{
		{"whole", iova, n},
		{"first-byte", iova, 1},
		{"first-8", iova, 8},
		{"last-byte", iova + n - 1, 1},
		{"last-8", iova + n - 8, 8},
		{"misaligned-8", iova + 4, 8},
		{"middle-8", iova + 16, 8},
		{"before-start", iova - 1, 1},
		{"before-start-8", iova - 8, 8},
		{"straddle-start", iova - 4, 8},
		{"past-end", iova + n, 1},
		{"past-end-8", iova + n, 8},
		{"straddle-end", iova + n - 4, 8},
		{"one-too-long", iova, n + 1},
		{"len-wraps-to-start", iova + 8, math.MaxUint64 - 7},
		{"len-max", iova, math.MaxUint64},
		{"va-max", math.MaxUint64, 1},
		{"va-max-8", math.MaxUint64 - 7, 8},
		{"va-zero", 0, 8},
		{"zero-len-inside", iova + 1, 0},
		{"zero-len-outside", iova + n + 100, 0},
		{"zero-len-va-max", math.MaxUint64, 0},
	}
}

// TestAccessMatrix checks every combination of access flags × operation ×
// range (edges and overflow tricks) × right/wrong PD × live/stale key.
func TestAccessMatrix(t *testing.T) {
	const n = 64
	iovas := []struct {
		name string
		iova func(buf []byte) uint64
		opt  bool
	}{
		{"va", func(b []byte) uint64 { return addrOf(b) }, false},
		{"zero", func([]byte) uint64 { return 0 }, true},
		{"top", func([]byte) uint64 { return math.MaxUint64 - n + 1 }, true}, // last byte at 2^64-1
		{"mid", func([]byte) uint64 { return 0x8000_0000_0000_1000 }, true},
	}
	base := []Access{LocalWrite, RemoteWrite, RemoteRead, RemoteAtomic, MWBind}
	tb := newTestTable(t)
	pd, other := mustPD(t, tb), mustPD(t, tb)

	checked, failures := 0, 0
	for mask := range 1 << len(base) {
		var access Access
		for i, a := range base {
			if mask&(1<<i) != 0 {
				access |= a
			}
		}
		for _, iv := range iovas {
			buf := alignedBuf(n)
			var opts []RegOption
			if iv.opt {
				opts = append(opts, WithIOVA(iv.iova(buf)))
			}
			m, err := tb.RegMR(pd, buf, access, opts...)
			if access&(RemoteWrite|RemoteAtomic) != 0 && access&LocalWrite == 0 {
				require.ErrorIs(t, err, ErrAccessCombo, "access %v", access)
				require.Nil(t, m)
				continue
			}
			require.NoError(t, err, "access %v", access)
			iova := iv.iova(buf)
			require.Equal(t, iova, m.IOVA())

			// Stale keys: one of a deregistered region, one replaced by
			// re-registration of the live region.
			gone, err := tb.RegMR(pd, alignedBuf(n), access, opts...)
			require.NoError(t, err)
			staleDereg := gone.LKey()
			require.NoError(t, gone.Dereg())
			staleRereg := m.LKey()
			require.NoError(t, m.Rereg(ReregAccess, nil, nil, access))
			require.NotEqual(t, staleRereg, m.LKey())
			require.Equal(t, KeyIndex(staleRereg), KeyIndex(m.LKey()))

			keys := []struct {
				name string
				key  uint32
				live bool
			}{{"live", m.LKey(), true}, {"stale-dereg", staleDereg, false}, {"stale-rereg", staleRereg, false}}
			for _, o := range matrixOps {
				for _, rc := range rangeCases(iova, n) {
					for _, rightPD := range []bool{true, false} {
						qpPD := pd
						if !rightPD {
							qpPD = other
						}
						for _, k := range keys {
							checked++
							want := expectLookup(access, o, rc.va, rc.length, iova, n, rightPD, k.live)
							reg, got := tb.Lookup(k.key, o.kind, qpPD, rc.va, rc.length, o.need)
							desc := fmt.Sprintf("access=%v iova=%s op=%s range=%s pd=%t key=%s", access, iv.name, o.name, rc.name, rightPD, k.name)
							if !errors.Is(got, want) || (want == nil) != (got == nil) {
								failures++
								if failures < 20 {
									t.Errorf("%s: got %v, want %v", desc, got, want)
								}
								reg.Release()
								continue
							}
							if got == nil {
								if rc.length == 0 {
									if reg.Len() != 0 {
										t.Errorf("%s: zero-length access returned %d bytes", desc, reg.Len())
									}
								} else if reg.Len() != int(rc.length) || !samePtr(reg.Bytes(), buf[rc.va-iova:]) {
									failures++
									t.Errorf("%s: region does not alias buf[%d:+%d]", desc, rc.va-iova, rc.length)
								}
								reg.Release()
							}
						}
					}
				}
			}
			require.NoError(t, m.Dereg())
		}
	}
	require.Zero(t, failures, "of %d combinations", checked)
	require.Greater(t, checked, 40000)
	_, mrs, _ := tb.Counts()
	require.Zero(t, mrs, "every region deregistered")
}

// TestLookupKinds covers key-kind rules the matrix does not: lkeys never
// name windows, unknown kinds and out-of-range indexes fail.
func TestLookupKinds(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	buf := alignedBuf(64)
	m, err := tb.RegMR(pd, buf, LocalWrite|RemoteRead|MWBind)
	require.NoError(t, err)
	w, err := tb.AllocMW(pd, MWType1)
	require.NoError(t, err)
	rkey, err := w.Bind(m, m.IOVA(), 64, RemoteRead)
	require.NoError(t, err)

	_, err = tb.Lookup(rkey, LKey, pd, m.IOVA(), 8, 0)
	require.ErrorIs(t, err, ErrInvalidKey, "window rkey used as lkey")
	_, err = tb.Lookup(m.LKey(), KeyKind(7), pd, m.IOVA(), 8, 0)
	require.ErrorIs(t, err, ErrInvalidKey, "unknown kind")
	for _, key := range []uint32{0, 0xff, MakeKey(MaxMWIndex+1, 3), math.MaxUint32, MakeKey(KeyIndex(m.LKey())+1, KeyPart(m.LKey()))} {
		_, err = tb.Lookup(key, RKey, pd, m.IOVA(), 8, RemoteRead)
		require.ErrorIs(t, err, ErrInvalidKey, "key %#x", key)
	}
	// A key that differs only in the key part is rejected for every part.
	for part := range 256 {
		key := MakeKey(KeyIndex(m.LKey()), uint8(part))
		reg, err := tb.Lookup(key, RKey, pd, m.IOVA(), 8, RemoteRead)
		if key == m.RKey() {
			require.NoError(t, err)
			reg.Release()
		} else {
			require.ErrorIs(t, err, ErrInvalidKey)
		}
	}
	reg, err := tb.Lookup(rkey, RKey, pd, m.IOVA()+8, 8, RemoteRead)
	require.NoError(t, err)
	require.True(t, samePtr(reg.Bytes(), buf[8:]))
	reg.Release()
	reg.Release() // second release of the same variable is a no-op
}
