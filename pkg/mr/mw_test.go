package mr

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

type mwFixture struct {
	tb    *Table
	pd    *PD
	other *PD
	buf   []byte
	mr    *MR
}

func newMWFixture(t *testing.T, access Access) *mwFixture {
	tb := newTestTable(t)
	f := &mwFixture{tb: tb, pd: mustPD(t, tb), other: mustPD(t, tb), buf: alignedBuf(256)}
	var err error
	f.mr, err = tb.RegMR(f.pd, f.buf, access)
	require.NoError(t, err)
	return f
}

func TestMWType1(t *testing.T) {
	f := newMWFixture(t, LocalWrite|RemoteRead|MWBind)
	w, err := f.tb.AllocMW(f.pd, MWType1)
	require.NoError(t, err)
	require.Equal(t, MWType1, w.Type())
	require.True(t, IsMWKey(w.RKey()))
	require.False(t, w.Bound())
	_, err = f.tb.Lookup(w.RKey(), RKey, f.pd, f.mr.IOVA(), 8, RemoteRead)
	require.ErrorIs(t, err, ErrInvalidated, "valid but unbound")

	base := f.mr.IOVA() + 64
	old := w.RKey()
	rkey, err := w.Bind(f.mr, base, 64, RemoteRead|RemoteWrite)
	require.NoError(t, err)
	require.Equal(t, IncKey(old), rkey, "ibv_bind_mw increments the key part")
	require.Equal(t, rkey, w.RKey())
	require.True(t, w.Bound())
	mr, addr, length, access := w.Binding()
	require.Equal(t, f.mr, mr)
	require.Equal(t, base, addr)
	require.Equal(t, uint64(64), length)
	require.Equal(t, RemoteRead|RemoteWrite, access)

	_, err = f.tb.Lookup(old, RKey, f.pd, base, 8, RemoteRead)
	require.ErrorIs(t, err, ErrInvalidKey, "key before the bind is stale")
	cases := []struct {
		name       string
		pd         *PD
		va, length uint64
		need       Access
		want       error
	}{
		{"read-start", f.pd, base, 8, RemoteRead, nil},
		{"read-all", f.pd, base, 64, RemoteRead, nil},
		{"read-last", f.pd, base + 63, 1, RemoteRead, nil},
		// Window bounds are enforced even though the region is larger
		// (rxe checks only the region; IBA requires the window).
		{"before-window", f.pd, base - 1, 1, RemoteRead, ErrRange},
		{"after-window", f.pd, base + 64, 1, RemoteRead, ErrRange},
		{"straddle", f.pd, base + 60, 8, RemoteRead, ErrRange},
		{"huge", f.pd, base + 8, math.MaxUint64 - 7, RemoteRead, ErrRange},
		// Window rights apply, not the region's: the window grants write
		// although the region has no REMOTE_WRITE.
		{"write", f.pd, base, 8, RemoteWrite, nil},
		{"atomic", f.pd, base, 8, RemoteAtomic, ErrAccess},
		{"wrong-pd", f.other, base, 8, RemoteRead, ErrPDMismatch},
		{"zero-len-anywhere", f.other, 0, 0, RemoteRead, nil},
	}
	for _, c := range cases {
		reg, err := f.tb.Lookup(rkey, RKey, c.pd, c.va, c.length, c.need)
		if c.want != nil {
			require.ErrorIs(t, err, c.want, c.name)
			continue
		}
		require.NoError(t, err, c.name)
		if c.length > 0 {
			require.True(t, samePtr(reg.Bytes(), f.buf[c.va-f.mr.IOVA():]), c.name)
		}
		require.Equal(t, int(c.length), reg.Len())
		reg.Release()
	}

	// Rebinding a type 1 window moves it and changes the key again.
	rkey2, err := w.Bind(f.mr, f.mr.IOVA(), 16, RemoteRead)
	require.NoError(t, err)
	require.NotEqual(t, rkey, rkey2)
	_, err = f.tb.Lookup(rkey, RKey, f.pd, base, 8, RemoteRead)
	require.ErrorIs(t, err, ErrInvalidKey)
	reg, err := f.tb.Lookup(rkey2, RKey, f.pd, f.mr.IOVA()+8, 8, RemoteRead)
	require.NoError(t, err)
	reg.Release()

	// Type 1 windows cannot be invalidated (o10-37.2.26).
	require.ErrorIs(t, f.tb.Invalidate(f.pd, NoQP, rkey2), ErrBadState)
	require.True(t, w.Bound())

	require.NoError(t, w.Dealloc())
	_, err = f.tb.Lookup(rkey2, RKey, f.pd, f.mr.IOVA(), 8, RemoteRead)
	require.ErrorIs(t, err, ErrInvalidKey)
	require.NoError(t, f.mr.Dereg(), "dealloc unbound the window")
}

func TestMWType2(t *testing.T) {
	f := newMWFixture(t, LocalWrite|RemoteRead|MWBind)
	const qpn, otherQPN = 0x11, 0x12
	w, err := f.tb.AllocMW(f.pd, MWType2)
	require.NoError(t, err)
	_, err = f.tb.LookupQP(w.RKey(), RKey, f.pd, qpn, f.mr.IOVA(), 8, 0)
	require.ErrorIs(t, err, ErrInvalidated, "type 2 starts free")

	newKey := IncKey(w.RKey())
	bind := Bind{MWKey: w.RKey(), NewKey: newKey, MRKey: f.mr.LKey(), Addr: f.mr.IOVA() + 128, Length: 32, Access: RemoteWrite | RemoteAtomic | ZeroBased}
	rkey, err := f.tb.BindMW(f.pd, qpn, bind)
	require.NoError(t, err)
	require.Equal(t, newKey, rkey)

	// Zero based: offsets from 0 address the window.
	reg, err := f.tb.LookupQP(rkey, RKey, f.pd, qpn, 8, 8, RemoteAtomic)
	require.NoError(t, err)
	require.True(t, samePtr(reg.Bytes(), f.buf[136:]))
	require.Zero(t, FetchAdd(reg.Bytes(), 9))
	reg.Release()
	_, err = f.tb.LookupQP(rkey, RKey, f.pd, qpn, 4, 8, RemoteAtomic)
	require.ErrorIs(t, err, ErrAlign)
	_, err = f.tb.LookupQP(rkey, RKey, f.pd, qpn, 32, 1, RemoteWrite)
	require.ErrorIs(t, err, ErrRange)
	_, err = f.tb.LookupQP(rkey, RKey, f.pd, qpn, f.mr.IOVA()+128, 8, RemoteWrite)
	require.ErrorIs(t, err, ErrRange, "virtual addresses do not work on a zero-based window")

	// Type 2 windows belong to the QP that bound them.
	_, err = f.tb.LookupQP(rkey, RKey, f.pd, otherQPN, 0, 8, RemoteWrite)
	require.ErrorIs(t, err, ErrInvalidKey)
	_, err = f.tb.Lookup(rkey, RKey, f.pd, 0, 8, RemoteWrite)
	require.ErrorIs(t, err, ErrInvalidKey, "Lookup is NoQP")

	// A bound type 2 window cannot be bound again (o10-37.2.30).
	bind.MWKey, bind.NewKey = rkey, IncKey(rkey)
	_, err = f.tb.BindMW(f.pd, qpn, bind)
	require.ErrorIs(t, err, ErrBind)
	require.ErrorIs(t, err, ErrBadState)

	require.ErrorIs(t, f.mr.Dereg(), ErrMWBound)

	// Invalidation: key must match, PD and QP must be the window's.
	require.ErrorIs(t, f.tb.Invalidate(f.pd, qpn, w.RKey()^1), ErrInvalidKey)
	require.ErrorIs(t, f.tb.Invalidate(f.other, qpn, rkey), ErrPDMismatch)
	require.ErrorIs(t, f.tb.Invalidate(f.pd, otherQPN, rkey), ErrBadQP)
	require.True(t, w.Bound(), "failed invalidations change nothing")
	require.NoError(t, f.tb.Invalidate(f.pd, qpn, rkey))
	require.False(t, w.Bound())
	require.Equal(t, rkey, w.RKey(), "the key stays until the next bind")
	_, err = f.tb.LookupQP(rkey, RKey, f.pd, qpn, 0, 8, RemoteWrite)
	require.ErrorIs(t, err, ErrInvalidated)
	require.ErrorIs(t, f.tb.Invalidate(f.pd, qpn, rkey), ErrInvalidated, "already free")

	// Bound again with a new key from another QP: the old key is stale.
	rkey3, err := f.tb.BindMW(f.pd, otherQPN, Bind{MWKey: rkey, NewKey: IncKey(rkey), MRKey: f.mr.LKey(), Addr: f.mr.IOVA(), Length: 8, Access: RemoteWrite})
	require.NoError(t, err)
	_, err = f.tb.LookupQP(rkey, RKey, f.pd, otherQPN, f.mr.IOVA(), 8, RemoteWrite)
	require.ErrorIs(t, err, ErrInvalidKey)
	reg, err = f.tb.LookupQP(rkey3, RKey, f.pd, otherQPN, f.mr.IOVA(), 8, RemoteWrite)
	require.NoError(t, err)
	reg.Release()
	require.NoError(t, w.Dealloc())
	require.NoError(t, f.mr.Dereg())
}

// TestBindChecks table-tests rxe's and IBA's bind rules; every rejection
// is an ErrBind plus the cause and leaves the window as it was.
func TestBindChecks(t *testing.T) {
	tb := newTestTable(t)
	pd, other := mustPD(t, tb), mustPD(t, tb)
	buf := alignedBuf(128)
	bindable, err := tb.RegMR(pd, buf, LocalWrite|RemoteRead|MWBind)
	require.NoError(t, err)
	readOnly, err := tb.RegMR(pd, alignedBuf(64), RemoteRead|MWBind) // no LOCAL_WRITE
	require.NoError(t, err)
	noBind, err := tb.RegMR(pd, alignedBuf(64), LocalWrite|RemoteRead)
	require.NoError(t, err)
	otherPD, err := tb.RegMR(other, alignedBuf(64), LocalWrite|MWBind)
	require.NoError(t, err)
	fast, err := tb.AllocFastMR(pd, 64)
	require.NoError(t, err)
	w1, err := tb.AllocMW(pd, MWType1)
	require.NoError(t, err)
	w2, err := tb.AllocMW(pd, MWType2)
	require.NoError(t, err)

	ok := func(w *MW) Bind {
		return Bind{MWKey: w.RKey(), NewKey: IncKey(w.RKey()), MRKey: bindable.LKey(), Addr: bindable.IOVA(), Length: 64, Access: RemoteRead}
	}
	cases := []struct {
		name  string
		w     *MW
		pd    *PD
		edit  func(*Bind)
		cause error
	}{
		{"stale-mw-key", w1, pd, func(b *Bind) { b.MWKey ^= 1 }, ErrInvalidKey},
		{"unknown-mw", w1, pd, func(b *Bind) { b.MWKey = MakeKey(MaxMWIndex, 0) }, ErrInvalidKey},
		{"stale-mr-key", w1, pd, func(b *Bind) { b.MRKey ^= 1 }, ErrInvalidKey},
		{"mr-key-is-window", w1, pd, func(b *Bind) { b.MRKey = w2.RKey() }, ErrInvalidKey},
		{"unsupported-access", w1, pd, func(b *Bind) { b.Access |= OnDemand }, ErrUnsupportedAccess},
		{"type1-zero-based", w1, pd, func(b *Bind) { b.Access |= ZeroBased }, ErrUnsupportedAccess},
		{"qp-pd", w1, other, nil, ErrPDMismatch},
		{"type2-qp-pd", w2, other, nil, ErrPDMismatch},
		{"type2-zero-length", w2, pd, func(b *Bind) { b.Length = 0 }, ErrInvalidArgument},
		{"mr-without-mw-bind", w1, pd, func(b *Bind) { b.MRKey, b.Addr = noBind.LKey(), noBind.IOVA() }, ErrAccess},
		{"mr-other-pd", w1, pd, func(b *Bind) { b.MRKey, b.Addr = otherPD.LKey(), otherPD.IOVA() }, ErrPDMismatch},
		{"mr-free-fast", w1, pd, func(b *Bind) { b.MRKey = fast.LKey() }, ErrInvalidated},
		{"writable-over-readonly-mr", w1, pd, func(b *Bind) {
			b.MRKey, b.Addr, b.Access = readOnly.LKey(), readOnly.IOVA(), RemoteWrite
		}, ErrAccessCombo},
		{"atomic-over-readonly-mr", w2, pd, func(b *Bind) {
			b.MRKey, b.Addr, b.Access = readOnly.LKey(), readOnly.IOVA(), RemoteAtomic
		}, ErrAccessCombo},
		{"before-mr", w1, pd, func(b *Bind) { b.Addr-- }, ErrRange},
		{"past-mr", w1, pd, func(b *Bind) { b.Addr += 65 }, ErrRange},
		{"too-long", w2, pd, func(b *Bind) { b.Length = 129 }, ErrRange},
		{"wrapping-length", w2, pd, func(b *Bind) { b.Addr += 8; b.Length = math.MaxUint64 - 7 }, ErrRange},
		{"zero-based-too-long", w2, pd, func(b *Bind) { b.Access |= ZeroBased; b.Length = 129 }, ErrRange},
	}
	for _, c := range cases {
		b := ok(c.w)
		if c.edit != nil {
			c.edit(&b)
		}
		before := c.w.RKey()
		_, err := tb.BindMW(c.pd, 1, b)
		require.ErrorIs(t, err, ErrBind, c.name)
		require.ErrorIs(t, err, c.cause, c.name)
		require.Equal(t, before, c.w.RKey(), c.name)
		require.False(t, c.w.Bound(), c.name)
	}
	// Read-only windows over a region without LOCAL_WRITE are fine.
	_, err = tb.BindMW(pd, 1, Bind{MWKey: w1.RKey(), NewKey: w1.RKey(), MRKey: readOnly.LKey(), Addr: readOnly.IOVA(), Length: 64, Access: RemoteRead})
	require.NoError(t, err)
	require.ErrorIs(t, readOnly.Dereg(), ErrMWBound)
	_, err = tb.AllocMW(pd, MWType(3))
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.Equal(t, "type2", MWType2.String())
}

func TestDetachQP(t *testing.T) {
	f := newMWFixture(t, LocalWrite|RemoteRead|MWBind)
	var keys []uint32
	for i := range 3 {
		w, err := f.tb.AllocMW(f.pd, MWType2)
		require.NoError(t, err)
		qpn := uint32(0x20)
		if i == 2 {
			qpn = 0x21
		}
		rkey, err := f.tb.BindMW(f.pd, qpn, Bind{MWKey: w.RKey(), NewKey: IncKey(w.RKey()), MRKey: f.mr.LKey(), Addr: f.mr.IOVA(), Length: 8, Access: RemoteRead})
		require.NoError(t, err)
		keys = append(keys, rkey)
	}
	t1, err := f.tb.AllocMW(f.pd, MWType1)
	require.NoError(t, err)
	_, err = t1.Bind(f.mr, f.mr.IOVA(), 8, RemoteRead)
	require.NoError(t, err)

	require.Equal(t, 2, f.tb.DetachQP(0x20))
	require.Zero(t, f.tb.DetachQP(0x20))
	for i, k := range keys {
		qpn := uint32(0x20)
		if i == 2 {
			qpn = 0x21
		}
		reg, err := f.tb.LookupQP(k, RKey, f.pd, qpn, f.mr.IOVA(), 8, RemoteRead)
		if i == 2 {
			require.NoError(t, err, "other QP's window untouched")
			reg.Release()
		} else {
			require.ErrorIs(t, err, ErrInvalidated)
		}
	}
	require.True(t, t1.Bound(), "type 1 windows do not belong to a QP")
	require.Equal(t, 1, f.tb.DetachQP(0x21))
	_, err = t1.Bind(nil, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, f.mr.Dereg(), "no windows left bound")
}
