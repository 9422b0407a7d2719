package mr

import (
	"math"
	"testing"
)

// FuzzLookupRange compares the range check with 128-bit arithmetic for
// arbitrary IOVAs, addresses and lengths, through a region and through a
// window over it.
func FuzzLookupRange(f *testing.F) {
	f.Add(uint64(0), uint16(64), uint64(0), uint64(64))
	f.Add(uint64(math.MaxUint64-63), uint16(64), uint64(math.MaxUint64), uint64(1))
	f.Add(uint64(100), uint16(10), uint64(108), uint64(math.MaxUint64-7))
	f.Add(uint64(1<<63), uint16(1), uint64(1<<63), uint64(0))
	tb := newTestTable(f)
	pd := mustPD(f, tb)
	f.Fuzz(func(t *testing.T, iova uint64, n16 uint16, va, length uint64) {
		n := uint64(n16%512) + 1
		if n-1 > math.MaxUint64-iova {
			iova = math.MaxUint64 - (n - 1)
		}
		buf := make([]byte, n)
		m, err := tb.RegMR(pd, buf, LocalWrite|RemoteWrite|MWBind, WithIOVA(iova))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Dereg()
		want := length == 0 || inRange128(va, length, iova, n)
		reg, err := tb.Lookup(m.RKey(), RKey, pd, va, length, RemoteWrite)
		if (err == nil) != want {
			t.Fatalf("iova %#x n %d va %#x len %#x: err %v, want ok=%t", iova, n, va, length, err, want)
		}
		if err == nil && length > 0 && !samePtr(reg.Bytes(), buf[va-iova:]) {
			t.Fatal("wrong memory")
		}
		reg.Release()

		// A window over the second half of the region.
		w, err := tb.AllocMW(pd, MWType1)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Dealloc()
		half := n / 2
		rkey, err := w.Bind(m, iova+half, n-half, RemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		want = length == 0 || inRange128(va, length, iova+half, n-half)
		reg, err = tb.Lookup(rkey, RKey, pd, va, length, RemoteWrite)
		if (err == nil) != want {
			t.Fatalf("window iova %#x n %d va %#x len %#x: err %v, want ok=%t", iova+half, n-half, va, length, err, want)
		}
		reg.Release()
		if _, err := w.Bind(nil, 0, 0, 0); err != nil {
			t.Fatal(err)
		}
	})
}
