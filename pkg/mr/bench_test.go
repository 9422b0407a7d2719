package mr

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func benchRegion(tb testing.TB) (*Table, *PD, *MR, *MW) {
	t := newTestTable(tb)
	pd := mustPD(tb, t)
	m, err := t.RegMR(pd, alignedBuf(4096), LocalWrite|RemoteWrite|RemoteRead|RemoteAtomic|MWBind)
	require.NoError(tb, err)
	w, err := t.AllocMW(pd, MWType1)
	require.NoError(tb, err)
	_, err = w.Bind(m, m.IOVA(), 4096, RemoteWrite|RemoteRead)
	require.NoError(tb, err)
	return t, pd, m, w
}

// TestLookupDoesNotAllocate pins the data-path promise: no allocation per
// lookup, for regions, windows and failures alike.
func TestLookupDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates")
	}
	tb, pd, m, w := benchRegion(t)
	paths := map[string]func(){
		"mr": func() {
			reg, err := tb.Lookup(m.RKey(), RKey, pd, m.IOVA()+64, 1024, RemoteWrite)
			if err != nil {
				panic(err)
			}
			reg.Release()
		},
		"mw": func() {
			reg, err := tb.Lookup(w.RKey(), RKey, pd, m.IOVA()+64, 1024, RemoteRead)
			if err != nil {
				panic(err)
			}
			reg.Release()
		},
		"atomic": func() {
			reg, err := tb.Lookup(m.RKey(), RKey, pd, m.IOVA()+8, 8, RemoteAtomic)
			if err != nil {
				panic(err)
			}
			FetchAdd(reg.Bytes(), 1)
			reg.Release()
		},
		"fail": func() {
			if _, err := tb.Lookup(m.RKey()^1, RKey, pd, m.IOVA(), 8, RemoteRead); err == nil {
				panic("stale key resolved")
			}
			if _, err := tb.Lookup(m.RKey(), RKey, pd, m.IOVA()+4096, 8, RemoteRead); err == nil {
				panic("out of range resolved")
			}
		},
	}
	for name, f := range paths {
		require.Zero(t, testing.AllocsPerRun(1000, f), name)
	}
}

func BenchmarkLookup(b *testing.B) {
	tb, pd, m, _ := benchRegion(b)
	b.ReportAllocs()
	for b.Loop() {
		reg, err := tb.Lookup(m.RKey(), RKey, pd, m.IOVA()+64, 1024, RemoteWrite)
		if err != nil {
			b.Fatal(err)
		}
		reg.Release()
	}
}

func BenchmarkLookupMW(b *testing.B) {
	tb, pd, m, w := benchRegion(b)
	b.ReportAllocs()
	for b.Loop() {
		reg, err := tb.Lookup(w.RKey(), RKey, pd, m.IOVA()+64, 1024, RemoteRead)
		if err != nil {
			b.Fatal(err)
		}
		reg.Release()
	}
}

// BenchmarkLookupParallel shows how lookups of one hot region scale across
// cores (they share the region version's reference count).
func BenchmarkLookupParallel(b *testing.B) {
	tb, pd, m, _ := benchRegion(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			reg, err := tb.Lookup(m.LKey(), LKey, pd, m.IOVA(), 64, 0)
			if err != nil {
				b.Error(err)
				return
			}
			reg.Release()
		}
	})
}

func BenchmarkFetchAdd(b *testing.B) {
	buf := alignedBuf(16)
	b.ReportAllocs()
	for b.Loop() {
		FetchAdd(buf, 1)
	}
}

func BenchmarkFetchAddUnaligned(b *testing.B) {
	buf := alignedBuf(16)
	b.ReportAllocs()
	for b.Loop() {
		FetchAdd(buf[1:], 1)
	}
}

func BenchmarkFetchAddContended(b *testing.B) {
	buf := alignedBuf(16)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			FetchAdd(buf, 1)
		}
	})
}

func BenchmarkCompareSwap(b *testing.B) {
	buf := alignedBuf(16)
	b.ReportAllocs()
	var v uint64
	for b.Loop() {
		CompareSwap(buf, v, v+1)
		v++
	}
}

// BenchmarkRemoteAtomic is the responder's whole atomic: lookup, FetchAdd,
// release.
func BenchmarkRemoteAtomic(b *testing.B) {
	tb, pd, m, _ := benchRegion(b)
	b.ReportAllocs()
	for b.Loop() {
		reg, err := tb.Lookup(m.RKey(), RKey, pd, m.IOVA()+8, 8, RemoteAtomic)
		if err != nil {
			b.Fatal(err)
		}
		FetchAdd(reg.Bytes(), 1)
		reg.Release()
	}
}

func BenchmarkRegDereg(b *testing.B) {
	tb := newTestTable(b)
	pd := mustPD(b, tb)
	buf := alignedBuf(4096)
	b.ReportAllocs()
	for b.Loop() {
		m, err := tb.RegMR(pd, buf, LocalWrite)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Dereg(); err != nil {
			b.Fatal(err)
		}
	}
}
