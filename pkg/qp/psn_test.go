package qp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPSNArithmeticWraps(t *testing.T) {
	cases := []struct {
		p    PSN
		n    uint32
		add  PSN
		sub  PSN
		next PSN
		prev PSN
	}{
		{0, 1, 1, 0xFFFFFF, 1, 0xFFFFFF},
		{0xFFFFFF, 1, 0, 0xFFFFFE, 0, 0xFFFFFE},
		{0xFFFFFE, 3, 1, 0xFFFFFB, 0xFFFFFF, 0xFFFFFD},
		{0x7FFFFF, 0x800000, 0xFFFFFF, 0xFFFFFF, 0x800000, 0x7FFFFE},
		{5, 1 << 24, 5, 5, 6, 4},
		{0x123456, 0xFFFFFFFF, 0x123455, 0x123457, 0x123457, 0x123455},
	}
	for _, c := range cases {
		require.Equal(t, c.add, c.p.Add(c.n), "%v.Add(%#x)", c.p, c.n)
		require.Equal(t, c.sub, c.p.Sub(c.n), "%v.Sub(%#x)", c.p, c.n)
		require.Equal(t, c.next, c.p.Next(), "%v.Next()", c.p)
		require.Equal(t, c.prev, c.p.Prev(), "%v.Prev()", c.p)
		require.True(t, c.p.Add(c.n).Valid())
		require.True(t, c.p.Sub(c.n).Valid())
	}
}

func TestPSNDiffAndOrder(t *testing.T) {
	cases := []struct {
		p, q PSN
		diff int32
	}{
		{0, 0, 0},
		{1, 0, 1},
		{0, 1, -1},
		{0, 0xFFFFFF, 1},         // wrap: 0 comes right after 0xFFFFFF
		{0xFFFFFF, 0, -1},        // and 0xFFFFFF right before 0
		{0x000010, 0xFFFFF0, 32}, // across the wrap
		{0xFFFFF0, 0x000010, -32},
		{0x7FFFFF, 0, 0x7FFFFF},  // largest positive distance
		{0x800000, 0, -0x800000}, // half way round counts as behind
		{0, 0x800000, -0x800000},
		{0x800001, 0, -0x7FFFFF},
		{0x123456, 0x123450, 6},
	}
	for _, c := range cases {
		d := c.p.Diff(c.q)
		require.Equal(t, c.diff, d, "%v.Diff(%v)", c.p, c.q)
		require.Equal(t, d < 0, c.p.Less(c.q), "%v.Less(%v)", c.p, c.q)
		require.Equal(t, d <= 0, c.p.LessEq(c.q), "%v.LessEq(%v)", c.p, c.q)
		// Adding the distance back gets the other value.
		require.Equal(t, c.p, c.q.Add(uint32(d)), "q+diff")
	}
	// Antisymmetry away from the exact half-space point.
	for _, pair := range [][2]PSN{{0, 1}, {0xFFFFFF, 0}, {0x400000, 0xC00001}, {7, 0x7FFFFF}} {
		a, b := pair[0], pair[1]
		require.NotEqual(t, a.Less(b), b.Less(a), "%v vs %v", a, b)
	}
}

func TestPSNWindow(t *testing.T) {
	cases := []struct {
		p, first PSN
		size     uint32
		in       bool
	}{
		{0, 0, 1, true},
		{1, 0, 1, false},
		{0, 0, 0, false},
		{0xFFFFFF, 0xFFFFFE, 2, true},
		{0, 0xFFFFFE, 2, false},
		{0, 0xFFFFFE, 3, true},
		{5, 0xFFFFFE, 8, true},
		{6, 0xFFFFFE, 8, false},
		{0xFFFFFD, 0xFFFFFE, 8, false},
		{0xABCDEF, 0, 1 << 24, true},
	}
	for _, c := range cases {
		require.Equal(t, c.in, c.p.InWindow(c.first, c.size), "%v in [%v,+%d)", c.p, c.first, c.size)
	}
	require.True(t, PSN(0).InRange(0xFFFFF0, 0x10))
	require.False(t, PSN(0x10).InRange(0xFFFFF0, 0x10))
	require.True(t, PSN(0xFFFFF0).InRange(0xFFFFF0, 0x10))
	require.False(t, PSN(0xFFFFEF).InRange(0xFFFFF0, 0x10))
}

func TestPSNConstruction(t *testing.T) {
	require.Equal(t, PSN(0x345678), NewPSN(0x12345678))
	require.Equal(t, PSN(0xFFFFFF), NewPSN(0xFFFFFFFF))
	require.False(t, PSN(1<<24).Valid())
	require.True(t, PSN(0xFFFFFF).Valid())
	require.Equal(t, "0x00abcd", PSN(0xABCD).String())
	require.Equal(t, uint32(42), PSN(42).Uint32())
}

func FuzzPSN(f *testing.F) {
	f.Add(uint32(0), uint32(0), uint32(1))
	f.Add(uint32(0xFFFFFF), uint32(0), uint32(0x800000))
	f.Fuzz(func(t *testing.T, a, b, n uint32) {
		p, q := NewPSN(a), NewPSN(b)
		if p.Add(n).Sub(n) != p {
			t.Fatalf("%v + %d - %d != %v", p, n, n, p)
		}
		d := p.Diff(q)
		if d < -PSNHalfSpace || d >= PSNHalfSpace {
			t.Fatalf("diff %d out of window", d)
		}
		if q.Add(uint32(d)) != p {
			t.Fatalf("q + diff != p")
		}
		// Exactly half the space apart both compare as "before" the
		// other, as with rxe's psn_compare; anywhere else order is strict.
		if p.Less(q) && q.Less(p) && d != -PSNHalfSpace {
			t.Fatalf("%v and %v both less", p, q)
		}
		if p.InWindow(q, uint32(uint16(n))) != (p.Sub(uint32(q)) < PSN(uint16(n))) {
			t.Fatalf("window disagrees")
		}
	})
}
