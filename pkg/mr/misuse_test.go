package mr

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
)

// snapshot captures what a failed call must leave unchanged.
type snapshot struct {
	pds, mrs, mws int
	key           uint32
	iova          uint64
	access        Access
	pd            *PD
}

func snap(tb *Table, m *MR) snapshot {
	s := snapshot{}
	s.pds, s.mrs, s.mws = tb.Counts()
	if m != nil {
		s.key, s.iova, s.access, s.pd = m.LKey(), m.IOVA(), m.Access(), m.PD()
	}
	return s
}

func TestRegisterEmptyBuffer(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	before := snap(tb, nil)
	for _, buf := range [][]byte{nil, {}, make([]byte, 10)[10:]} {
		m, err := tb.RegMR(pd, buf, LocalWrite)
		require.ErrorIs(t, err, ErrEmptyBuffer)
		require.Nil(t, m)
	}
	require.Equal(t, before, snap(tb, nil))
	require.NoError(t, pd.Dealloc(), "failed registrations hold no PD reference")
}

func TestRegisterBadAccess(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	cases := []struct {
		access Access
		want   error
	}{
		{RemoteWrite, ErrAccessCombo},
		{RemoteAtomic, ErrAccessCombo},
		{RemoteWrite | RemoteRead, ErrAccessCombo},
		{RemoteAtomic | RemoteRead | MWBind, ErrAccessCombo},
		{ZeroBased | LocalWrite, ErrUnsupportedAccess},
		{OnDemand, ErrUnsupportedAccess},
		{HugeTLB, ErrUnsupportedAccess},
		{1 << 12, ErrUnsupportedAccess},
		{1 << 31, ErrUnsupportedAccess},
		{FlushPersistent | LocalWrite, ErrUnsupportedAccess}, // not a file mapping
	}
	before := snap(tb, nil)
	for _, c := range cases {
		m, err := tb.RegMR(pd, make([]byte, 8), c.access)
		require.ErrorIs(t, err, c.want, "access %v", c.access)
		require.Contains(t, err.Error(), "access", "error names the problem")
		require.Nil(t, m)
	}
	require.Equal(t, before, snap(tb, nil))

	// Accepted: optional flags and flush-global.
	for _, a := range []Access{0, RelaxedOrdering | RemoteRead, FlushGlobal | RemoteRead, LocalWrite | RemoteWrite | RemoteAtomic | RemoteRead | MWBind} {
		m, err := tb.RegMR(pd, make([]byte, 8), a)
		require.NoError(t, err, "access %v", a)
		require.NoError(t, m.Dereg())
	}
}

func TestRegisterIOVAOverflow(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	_, err := tb.RegMR(pd, make([]byte, 16), 0, WithIOVA(^uint64(0)-14))
	require.ErrorIs(t, err, ErrIOVAOverflow)
	m, err := tb.RegMR(pd, make([]byte, 16), 0, WithIOVA(^uint64(0)-15))
	require.NoError(t, err, "last byte exactly at 2^64-1 is fine")
	require.NoError(t, m.Dereg())
}

func TestBadPD(t *testing.T) {
	tb, other := newTestTable(t), newTestTable(t)
	dead := mustPD(t, tb)
	require.NoError(t, dead.Dealloc())
	require.ErrorIs(t, dead.Dealloc(), ErrBadPD, "dealloc twice")
	foreign := mustPD(t, other)
	for _, pd := range []*PD{nil, dead, foreign} {
		_, err := tb.RegMR(pd, make([]byte, 8), 0)
		require.ErrorIs(t, err, ErrBadPD)
		_, err = tb.AllocMW(pd, MWType1)
		require.ErrorIs(t, err, ErrBadPD)
		_, err = tb.AllocFastMR(pd, 64)
		require.ErrorIs(t, err, ErrBadPD)
	}
	require.ErrorIs(t, dead.Hold(), ErrBadPD)
	_, mrs, mws := tb.Counts()
	require.Zero(t, mrs+mws)
}

func TestDeregTwice(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	m, err := tb.RegMR(pd, make([]byte, 8), LocalWrite)
	require.NoError(t, err)
	require.NoError(t, m.Dereg())
	before := snap(tb, nil)
	require.ErrorIs(t, m.Dereg(), ErrDeregistered)
	require.Equal(t, before, snap(tb, nil))
	require.Zero(t, m.LKey())
	require.Nil(t, m.PD())
	require.False(t, m.Valid())
	require.ErrorIs(t, m.Rereg(ReregAccess, nil, nil, 0), ErrDeregistered)
	require.NoError(t, pd.Dealloc())
}

func TestDeregWithBoundWindow(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	buf := make([]byte, 64)
	m, err := tb.RegMR(pd, buf, LocalWrite|RemoteRead|MWBind)
	require.NoError(t, err)
	w, err := tb.AllocMW(pd, MWType1)
	require.NoError(t, err)
	rkey, err := w.Bind(m, m.IOVA(), 32, RemoteRead)
	require.NoError(t, err)

	before := snap(tb, m)
	err = m.Dereg()
	require.ErrorIs(t, err, ErrMWBound)
	require.Contains(t, err.Error(), "1 windows")
	require.Equal(t, before, snap(tb, m))
	reg, err := tb.Lookup(m.LKey(), LKey, pd, m.IOVA(), 64, LocalWrite)
	require.NoError(t, err, "region still registered")
	reg.Release()
	reg, err = tb.Lookup(rkey, RKey, pd, m.IOVA(), 32, RemoteRead)
	require.NoError(t, err, "window still bound")
	reg.Release()
	require.ErrorIs(t, m.Rereg(ReregAccess, nil, nil, LocalWrite), ErrMWBound)
	require.Equal(t, before, snap(tb, m))

	// Unbinding (length 0) releases the region.
	_, err = w.Bind(nil, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, m.Dereg())
	require.NoError(t, w.Dealloc())
	require.ErrorIs(t, w.Dealloc(), ErrDeregistered)
	require.NoError(t, pd.Dealloc())
}

func TestPDDeallocWithLiveObjects(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	m, err := tb.RegMR(pd, make([]byte, 8), LocalWrite)
	require.NoError(t, err)
	w, err := tb.AllocMW(pd, MWType2)
	require.NoError(t, err)
	f, err := tb.AllocFastMR(pd, 64)
	require.NoError(t, err)
	require.NoError(t, pd.Hold())

	before := snap(tb, m)
	for _, step := range []func() error{m.Dereg, w.Dealloc, f.Dereg, func() error { pd.Unhold(); return nil }} {
		err := pd.Dealloc()
		require.ErrorIs(t, err, ErrPDBusy)
		require.Contains(t, err.Error(), "users")
		require.Equal(t, before.pds, snap(tb, nil).pds, "PD still there")
		require.NoError(t, step())
	}
	reg, err := tb.Lookup(m.LKey(), LKey, pd, m.IOVA(), 8, 0)
	require.ErrorIs(t, err, ErrInvalidKey)
	reg.Release()
	require.NoError(t, pd.Dealloc())
	pds, mrs, mws := tb.Counts()
	require.Zero(t, pds+mrs+mws)
}

func TestTableLimits(t *testing.T) {
	tb := newTestTable(t, WithLimits(2, 1, 1))
	pd := mustPD(t, tb)
	_, err := tb.AllocPD()
	require.ErrorIs(t, err, ErrNoResources)
	a, err := tb.RegMR(pd, make([]byte, 8), 0)
	require.NoError(t, err)
	_, err = tb.AllocFastMR(pd, 8)
	require.NoError(t, err)
	_, err = tb.RegMR(pd, make([]byte, 8), 0)
	require.ErrorIs(t, err, ErrNoResources)
	_, err = tb.AllocMW(pd, MWType1)
	require.NoError(t, err)
	_, err = tb.AllocMW(pd, MWType1)
	require.ErrorIs(t, err, ErrNoResources)
	require.NoError(t, a.Dereg())
	b, err := tb.RegMR(pd, make([]byte, 8), 0)
	require.NoError(t, err, "room again after dereg")
	require.NotEqual(t, a.LKey(), b.LKey(), "the freed key does not come back")
}

// TestKeysNotGuessable: indexes and key parts come from the random
// source, key parts differ from the previous key of the same index, and
// both are reproducible with a seed.
func TestKeysNotGuessable(t *testing.T) {
	keysOf := func(tb *Table) []uint32 {
		pd := mustPD(t, tb)
		var keys []uint32
		for range 64 {
			m, err := tb.RegMR(pd, make([]byte, 8), 0)
			require.NoError(t, err)
			keys = append(keys, m.LKey())
		}
		return keys
	}
	a, b := keysOf(newTestTable(t)), keysOf(newTestTable(t))
	require.Equal(t, a, b, "same seed, same keys")
	parts, idx := map[uint8]bool{}, map[uint32]bool{}
	sequential := 0
	for i, k := range a {
		require.True(t, KeyIndex(k) >= MinMRIndex && KeyIndex(k) <= MaxMRIndex, "index %#x in the region range", KeyIndex(k))
		if i > 0 && KeyIndex(k) == KeyIndex(a[i-1])+1 {
			sequential++
		}
		parts[KeyPart(k)] = true
		idx[KeyIndex(k)] = true
	}
	require.Greater(t, len(parts), 32, "key parts vary")
	require.Len(t, idx, len(a), "indexes are distinct")
	require.Less(t, sequential, 4, "indexes are not allocated in sequence")

	// A source that always yields the previous key part forces a retry;
	// a dead source is an error, not a predictable key.
	tb := NewTable(bytes.NewReader(bytes.Repeat([]byte{7}, 2000)))
	pd := mustPD(t, tb)
	m, err := tb.RegMR(pd, make([]byte, 8), 0)
	require.NoError(t, err)
	require.Equal(t, uint8(7), KeyPart(m.LKey()))
	err = m.Rereg(ReregAccess, nil, nil, LocalWrite)
	require.Error(t, err, "cannot pick a key part different from 7")
	require.Equal(t, uint8(7), KeyPart(m.LKey()), "unchanged")
	require.Equal(t, Access(0), m.Access(), "unchanged")
	dry := NewTable(bytes.NewReader(nil))
	_, err = dry.RegMR(mustPD(t, dry), make([]byte, 8), 0)
	require.ErrorContains(t, err, "randomness")
	_, mrs, _ := dry.Counts()
	require.Zero(t, mrs)
}

func TestAccessString(t *testing.T) {
	require.Equal(t, "0", Access(0).String())
	require.Equal(t, "LOCAL_WRITE|REMOTE_READ|MW_BIND", (LocalWrite | RemoteRead | MWBind).String())
	require.Equal(t, "REMOTE_ATOMIC|0x1000", (RemoteAtomic | 1<<12).String())
	require.Equal(t, "lkey", LKey.String())
	require.Equal(t, "rkey", RKey.String())
	require.Equal(t, uint32(0x1234500), IncKey(0x12345ff))
	require.Equal(t, uint32(0x1234510), IncKey(0x123450f))
}

func TestStatusMapping(t *testing.T) {
	for _, err := range []error{ErrInvalidKey, ErrPDMismatch, ErrAccess, ErrRange, ErrInvalidated} {
		require.Equal(t, StatusLocProtErr, LocalStatus(err))
		require.Equal(t, NAKRemoteAccess, RemoteNAK(err))
		require.Equal(t, StatusRemAccessErr, RemoteStatus(err))
	}
	require.Equal(t, NAKInvalidRequest, RemoteNAK(ErrAlign))
	require.Equal(t, StatusRemInvReqErr, RemoteStatus(ErrAlign))
	require.Equal(t, StatusSuccess, LocalStatus(nil))
	require.Equal(t, uint8(0), RemoteNAK(nil))
	require.Equal(t, StatusSuccess, RemoteStatus(nil))
	require.Equal(t, StatusRemInvReqErr, RemoteInvalidateStatus(ErrKeyMismatch))
	require.Equal(t, StatusSuccess, RemoteInvalidateStatus(nil))
}

func TestProgrammingErrorsPanic(t *testing.T) {
	require.PanicsWithValue(t, "mr: atomic operand shorter than 8 bytes", func() { FetchAdd(make([]byte, 7), 1) })
	require.Panics(t, func() { CompareSwap(nil, 0, 1) })

	tb := newTestTable(t)
	pd := mustPD(t, tb)
	require.PanicsWithValue(t, "mr: PD.Unhold without Hold", pd.Unhold)

	m, err := tb.RegMR(pd, make([]byte, 8), 0)
	require.NoError(t, err)
	reg, err := tb.Lookup(m.LKey(), LKey, pd, m.IOVA(), 8, 0)
	require.NoError(t, err)
	dup := reg
	reg.Release()
	require.NoError(t, m.Dereg())
	require.Panics(t, dup.Release, "releasing a copy twice is caught")

	// Over-releasing a live region's version makes its key fail instead
	// of hanging lookups.
	m, err = tb.RegMR(pd, make([]byte, 8), 0)
	require.NoError(t, err)
	reg, err = tb.Lookup(m.LKey(), LKey, pd, m.IOVA(), 8, 0)
	require.NoError(t, err)
	dup = reg
	reg.Release()
	dup.Release()
	_, err = tb.Lookup(m.LKey(), LKey, pd, m.IOVA(), 8, 0)
	require.ErrorIs(t, err, ErrInvalidKey)
}

func TestLoggerSeesRejections(t *testing.T) {
	var logged bytes.Buffer
	tb := newTestTable(t, WithLogger(slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	pd := mustPD(t, tb)
	require.Equal(t, tb, pd.Table())
	require.NotZero(t, pd.Handle())
	_, err := tb.RegMR(pd, make([]byte, 8), RemoteWrite)
	require.ErrorIs(t, err, ErrAccessCombo)
	require.Contains(t, logged.String(), "reg_mr rejected")
	require.Contains(t, logged.String(), "LOCAL_WRITE")
}
