package roce

import (
	"bytes"
	"errors"
	mrand "math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// seeded returns a reproducible randomness source for Config.Rand.
func seeded(b byte) *mrand.ChaCha8 {
	var seed [32]byte
	seed[0] = b
	return mrand.NewChaCha8(seed)
}

func newTestAllocator(t *testing.T, seed byte) *qpnAllocator {
	t.Helper()
	a, err := newQPNAllocator(seeded(seed))
	require.NoError(t, err)
	return a
}

// TestQPNAllocatorRandomInRange: numbers are distinct, inside
// [FirstQPN, 2^24) (never QP0, QP1 or rxe's reserved numbers), spread
// over the whole space and not sequential.
func TestQPNAllocatorRandomInRange(t *testing.T) {
	a := newTestAllocator(t, 1)
	const n = 10000
	got := make([]uint32, 0, n)
	seen := make(map[uint32]bool, n)
	successors := 0
	for i := range n {
		q, err := a.alloc()
		require.NoError(t, err)
		require.GreaterOrEqual(t, q, uint32(FirstQPN))
		require.LessOrEqual(t, q, uint32(maxQPN))
		require.False(t, seen[q], "number %#x handed out twice", q)
		seen[q] = true
		if i > 0 && q == got[i-1]+1 {
			successors++
		}
		got = append(got, q)
	}
	require.Less(t, successors, 3, "numbers must not follow each other")
	// Each eighth of the space gets about n/8; far off means a bias.
	var buckets [8]int
	for _, q := range got {
		buckets[q>>21]++
	}
	for i, c := range buckets {
		require.InDelta(t, n/8, c, n/16, "bucket %d", i)
	}
}

// TestQPNAllocatorSeed: the same seed gives the same numbers, another
// seed other numbers; a failing source fails the engine's creation.
func TestQPNAllocatorSeed(t *testing.T) {
	draw := func(a *qpnAllocator) []uint32 {
		var out []uint32
		for range 16 {
			q, err := a.alloc()
			require.NoError(t, err)
			out = append(out, q)
		}
		return out
	}
	first := draw(newTestAllocator(t, 7))
	require.Equal(t, first, draw(newTestAllocator(t, 7)))
	require.NotEqual(t, first, draw(newTestAllocator(t, 8)))

	_, err := newQPNAllocator(bytes.NewReader(make([]byte, 31)))
	require.Error(t, err, "a seed needs 32 bytes")
	c, err := transport.NewMemNetwork().Listen(netip.MustParseAddrPort("10.0.0.1:4791"))
	require.NoError(t, err)
	_, err = New(Config{Conn: c, Rand: bytes.NewReader(nil)})
	require.Error(t, err)
}

// TestQPNAllocatorSkipsInUseAndRecent works on a pool of 8 numbers with
// 4 held back: numbers in use are never drawn, a destroyed number stays
// out of reach until 4 more were destroyed, and one whose QP never
// existed is free at once.
func TestQPNAllocatorSkipsInUseAndRecent(t *testing.T) {
	a := newTestAllocator(t, 3)
	a.span = 8
	a.recent = make([]uint32, 4)
	var all []uint32
	for range 8 {
		q, err := a.alloc()
		require.NoError(t, err)
		all = append(all, q)
	}
	sorted := slices.Sorted(slices.Values(all))
	require.Equal(t, []uint32{0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18}, sorted, "every number once")
	_, err := a.alloc()
	require.ErrorIs(t, err, errNoQPN, "all in use")

	a.release(all[0], true)
	_, err = a.alloc()
	require.ErrorIs(t, err, errNoQPN, "a destroyed number is held back")
	for _, q := range all[1:5] {
		a.release(q, true)
	}
	// all[0] fell out of the window of 4; all[1..4] are still in it.
	q, err := a.alloc()
	require.NoError(t, err)
	require.Equal(t, all[0], q)
	_, err = a.alloc()
	require.ErrorIs(t, err, errNoQPN)

	// A held-back number asked for explicitly and destroyed again keeps
	// its newer place in the window: the older entry's eviction does not
	// release it.
	require.NoError(t, a.reserve(all[1]))
	a.release(all[1], true) // window now: all[2], all[3], all[4], all[1]
	a.release(all[5], true) // evicts all[2] (its first entry is gone)
	q, err = a.alloc()
	require.NoError(t, err)
	require.Equal(t, all[2], q)
	a.release(all[6], true) // evicts all[3]
	a.release(all[7], true) // evicts all[4]
	got := map[uint32]bool{}
	for range 2 {
		q, err := a.alloc()
		require.NoError(t, err)
		got[q] = true
	}
	require.Equal(t, map[uint32]bool{all[3]: true, all[4]: true}, got, "all[1] is still held back")
	_, err = a.alloc()
	require.ErrorIs(t, err, errNoQPN)

	// A number whose QP was never created goes straight back.
	a.release(all[3], false)
	q, err = a.alloc()
	require.NoError(t, err)
	require.Equal(t, all[3], q)
}

// createRC creates an RC QP on s's engine with QP number num (0: random).
func createRC(s *side, num uint32) (*qp.QP, error) {
	return s.e.CreateQP(qp.Config{Num: num, Type: qp.RC, PD: s.pd, SendCQ: s.scq, RecvCQ: s.rcq,
		Cap: qp.Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
}

func createGSI(s *side, num uint32) (*qp.QP, error) {
	return s.e.CreateQP(qp.Config{Num: num, Type: qp.GSI, PD: s.pd, SendCQ: s.scq, RecvCQ: s.rcq,
		Cap: qp.Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
}

// TestCreateQPNumbers: the GSI QP is QP1 and only one exists at a time;
// no other QP is QP1; explicit numbers are honoured unless in use or too
// wide; random numbers stay in range and are reproducible with a seed.
func TestCreateQPNumbers(t *testing.T) {
	s := newSide(t, transport.NewMemNetwork(), "10.0.0.1", qp.RC)
	require.GreaterOrEqual(t, s.q.Num(), uint32(FirstQPN))

	gsi, err := createGSI(s, 0)
	require.NoError(t, err)
	require.Equal(t, uint32(GSIQPN), gsi.Num())
	require.Equal(t, qp.GSI, gsi.Type())
	_, err = createGSI(s, 0)
	require.ErrorIs(t, err, ErrQPNInUse, "one GSI QP per device")
	_, err = createGSI(s, 0x20)
	require.Error(t, err, "the GSI QP is QP1")
	_, err = createRC(s, 1)
	require.Error(t, err, "QP1 is the GSI QP's")
	require.NoError(t, s.e.DestroyQP(gsi))
	require.NoError(t, s.e.DestroyQP(gsi), "destroying twice is harmless")
	again, err := createGSI(s, GSIQPN)
	require.NoError(t, err, "a destroyed GSI QP can be created again")
	require.Equal(t, uint32(GSIQPN), again.Num())

	_, err = createRC(s, s.q.Num())
	require.ErrorIs(t, err, ErrQPNInUse)
	_, err = createRC(s, 1<<24)
	require.Error(t, err)
	x, err := createRC(s, 0x42)
	require.NoError(t, err, "an explicit number (replayed captures)")
	require.Equal(t, uint32(0x42), x.Num())

	// A QP whose creation fails gives its number back: with a pool of
	// one number, a failed create does not exhaust it.
	s.e.qpns.lo, s.e.qpns.span = 0x1000, 1
	_, err = s.e.CreateQP(qp.Config{Type: qp.Type(9), PD: s.pd, SendCQ: s.scq, RecvCQ: s.rcq})
	require.Error(t, err)
	y, err := createRC(s, 0)
	require.NoError(t, err)
	require.Equal(t, uint32(0x1000), y.Num())

	nums := func(seed byte) []uint32 {
		c, err := transport.NewMemNetwork().Listen(netip.MustParseAddrPort("10.0.0.9:4791"))
		require.NoError(t, err)
		e, err := New(Config{Conn: c, Workers: 1, Rand: seeded(seed)})
		require.NoError(t, err)
		defer e.Close()
		pd, err := e.Memory().AllocPD()
		require.NoError(t, err)
		var out []uint32
		for range 4 {
			q, err := e.CreateQP(qp.Config{Type: qp.UD, PD: pd, SendCQ: s.scq, RecvCQ: s.rcq})
			require.NoError(t, err)
			out = append(out, q.Num())
		}
		return out
	}
	require.Equal(t, nums(5), nums(5), "Config.Rand makes the numbers reproducible")
	require.NotEqual(t, nums(5), nums(6))
}

// TestDestroyedQPNHeldBack: over many create/destroy cycles on a pool
// of 2048 numbers, a new QP never gets one of the last RecentQPNs numbers
// destroyed, yet numbers do come back once out of that window.
func TestDestroyedQPNHeldBack(t *testing.T) {
	s := newSide(t, transport.NewMemNetwork(), "10.0.0.1", qp.RC)
	s.e.qpns.lo, s.e.qpns.span = 0x100, 2*RecentQPNs
	keep, err := createRC(s, 0)
	require.NoError(t, err)
	var destroyed []uint32 // in order
	lastDestroyed := map[uint32]int{}
	reused := 0
	for i := range 4 * RecentQPNs {
		q, err := createRC(s, 0)
		require.NoError(t, err)
		n := q.Num()
		if j, ok := lastDestroyed[n]; ok {
			require.GreaterOrEqual(t, len(destroyed)-j, RecentQPNs,
				"cycle %d: %#x reused %d destroys after it was destroyed", i, n, len(destroyed)-j)
			reused++
		}
		require.NoError(t, s.e.DestroyQP(q))
		lastDestroyed[n] = len(destroyed)
		destroyed = append(destroyed, n)
	}
	require.NotZero(t, reused, "numbers outside the window are drawn again")
	// A QP that lives on keeps its number: it is never handed out again.
	require.NotContains(t, destroyed, keep.Num())
	_, err = createRC(s, keep.Num())
	require.True(t, errors.Is(err, ErrQPNInUse))
}
