package mr

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFastRegistration(t *testing.T) {
	tb := newTestTable(t)
	pd, other := mustPD(t, tb), mustPD(t, tb)
	m, err := tb.AllocFastMR(pd, 128)
	require.NoError(t, err)
	require.Equal(t, 128, m.MaxLen())
	require.False(t, m.Valid())
	key0 := m.LKey()
	_, err = tb.Lookup(key0, LKey, pd, 0, 8, 0)
	require.ErrorIs(t, err, ErrInvalidated, "allocated in the free state")

	buf := alignedBuf(128)
	newKey := IncKey(key0)
	access := LocalWrite | RemoteWrite | RemoteRead
	rejects := []struct {
		name  string
		pd    *PD
		key   uint32
		acc   Access
		buf   []byte
		cause error
	}{
		{"other-pd", other, newKey, access, buf, ErrPDMismatch},
		{"other-index", pd, MakeKey(KeyIndex(key0)+1, 0), access, buf, ErrKeyMismatch},
		{"too-big", pd, newKey, access, alignedBuf(129), ErrRange},
		{"empty", pd, newKey, access, nil, ErrEmptyBuffer},
		{"access-combo", pd, newKey, RemoteWrite, buf, ErrAccessCombo},
	}
	for _, r := range rejects {
		require.ErrorIs(t, m.FastReg(r.pd, r.key, r.acc, r.buf, 0x1000), r.cause, r.name)
		require.False(t, m.Valid(), r.name)
		require.Equal(t, key0, m.LKey(), r.name)
	}
	require.NoError(t, m.FastReg(pd, newKey, access, buf, 0x1000))
	require.True(t, m.Valid())
	require.Equal(t, newKey, m.LKey())
	require.Equal(t, newKey, m.RKey())
	require.Equal(t, uint64(0x1000), m.IOVA())
	_, err = tb.Lookup(key0, RKey, pd, 0x1000, 8, RemoteRead)
	require.ErrorIs(t, err, ErrInvalidKey, "the allocation key is stale")
	reg, err := tb.Lookup(newKey, RKey, pd, 0x1010, 16, RemoteWrite)
	require.NoError(t, err)
	require.True(t, samePtr(reg.Bytes(), buf[16:]))
	reg.Release()
	require.ErrorIs(t, m.FastReg(pd, IncKey(newKey), access, buf, 0), ErrBadState, "only free regions")

	// Invalidation: stale key, wrong PD fail; then local invalidate works.
	require.ErrorIs(t, tb.Invalidate(pd, NoQP, key0), ErrInvalidKey)
	require.ErrorIs(t, tb.Invalidate(other, NoQP, newKey), ErrPDMismatch)
	require.True(t, m.Valid())
	require.NoError(t, tb.Invalidate(pd, 7, newKey))
	require.False(t, m.Valid())
	_, err = tb.Lookup(newKey, RKey, pd, 0x1000, 8, RemoteRead)
	require.ErrorIs(t, err, ErrInvalidated)

	// Registered again with the next key (the usual ib_inc_rkey cycle);
	// a remote invalidate (SEND_WITH_INV) then needs the new key.
	k2 := IncKey(newKey)
	require.NoError(t, m.FastReg(pd, k2, RemoteRead, buf[:64], 0))
	require.ErrorIs(t, tb.Invalidate(pd, 9, newKey), ErrInvalidKey)
	require.NoError(t, tb.Invalidate(pd, 9, k2))

	// User regions cannot be fast-registered or invalidated.
	u, err := tb.RegMR(pd, alignedBuf(8), LocalWrite)
	require.NoError(t, err)
	require.ErrorIs(t, u.FastReg(pd, IncKey(u.LKey()), 0, buf, 0), ErrBadState)
	require.ErrorIs(t, tb.Invalidate(pd, NoQP, u.LKey()), ErrBadState)
	require.ErrorIs(t, tb.Invalidate(pd, NoQP, MakeKey(MaxMRIndex, 1)), ErrInvalidKey)
	require.ErrorIs(t, m.Rereg(ReregAccess, nil, nil, 0), ErrBadState, "rereg is for user regions")
	require.NoError(t, m.Dereg())
	require.ErrorIs(t, m.FastReg(pd, k2, 0, buf, 0), ErrDeregistered)
	_, err = tb.AllocFastMR(pd, 0)
	require.ErrorIs(t, err, ErrInvalidArgument)
}

func TestFastRegionWithBoundWindowCannotBeInvalidated(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	m, err := tb.AllocFastMR(pd, 64)
	require.NoError(t, err)
	key := IncKey(m.LKey())
	require.NoError(t, m.FastReg(pd, key, LocalWrite|MWBind, alignedBuf(64), 0))
	w, err := tb.AllocMW(pd, MWType1)
	require.NoError(t, err)
	_, err = w.Bind(m, 0, 64, RemoteRead)
	require.NoError(t, err)
	require.ErrorIs(t, tb.Invalidate(pd, NoQP, key), ErrMWBound)
	require.True(t, m.Valid())
	require.NoError(t, w.Dealloc())
	require.NoError(t, tb.Invalidate(pd, NoQP, key))
}

// Map holds the memory of the next REG_MR in the region itself:
// RegMapped registers (part of) it, and Dereg drops it.
func TestMapAndRegMapped(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	m, err := tb.AllocFastMR(pd, 64)
	require.NoError(t, err)
	user, err := tb.RegMR(pd, alignedBuf(8), LocalWrite)
	require.NoError(t, err)
	key := IncKey(m.LKey())

	require.ErrorIs(t, tb.RegMapped(pd, m.LKey(), key, LocalWrite, 0, 0x1000), ErrBadState, "before Map")
	require.ErrorIs(t, m.Map(alignedBuf(65)), ErrMapTooBig)
	require.ErrorIs(t, m.Map(nil), ErrEmptyBuffer)
	require.ErrorIs(t, user.Map(alignedBuf(8)), ErrNotFastMR)
	buf := alignedBuf(64)
	require.NoError(t, m.Map(buf))
	require.ErrorIs(t, tb.RegMapped(pd, m.LKey(), key, LocalWrite, 65, 0x1000), ErrMapTooBig)
	require.ErrorIs(t, tb.RegMapped(pd, key, key, LocalWrite, 0, 0x1000), ErrKeyMismatch, "not the current lkey")
	require.False(t, m.Valid())

	require.NoError(t, tb.RegMapped(pd, m.LKey(), key, LocalWrite, 16, 0x1000))
	require.Equal(t, key, m.LKey())
	require.Equal(t, 16, m.Len())
	require.True(t, samePtr(buf, m.Bytes()))

	require.NoError(t, m.Dereg())
	require.Nil(t, m.mapped, "Dereg drops the mapped memory")
	require.ErrorIs(t, m.Map(buf), ErrDeregistered)
}
