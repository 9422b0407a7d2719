package mr

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRereg(t *testing.T) {
	tb := newTestTable(t)
	pd, pd2 := mustPD(t, tb), mustPD(t, tb)
	buf := alignedBuf(64)
	m, err := tb.RegMR(pd, buf, LocalWrite)
	require.NoError(t, err)
	k0 := m.LKey()
	held, err := tb.Lookup(k0, LKey, pd, m.IOVA(), 64, LocalWrite)
	require.NoError(t, err)

	// Access: new key part, same index, new rights.
	require.NoError(t, m.Rereg(ReregAccess, nil, nil, LocalWrite|RemoteRead))
	k1 := m.LKey()
	require.Equal(t, KeyIndex(k0), KeyIndex(k1))
	require.NotEqual(t, k0, k1)
	_, err = tb.Lookup(k0, LKey, pd, m.IOVA(), 8, 0)
	require.ErrorIs(t, err, ErrInvalidKey)
	reg, err := tb.Lookup(k1, RKey, pd, m.IOVA(), 8, RemoteRead)
	require.NoError(t, err)
	reg.Release()

	// PD: the old PD loses its user, the new one gains it.
	require.NoError(t, m.Rereg(ReregPD, pd2, nil, 0))
	require.Equal(t, pd2, m.PD())
	require.Equal(t, LocalWrite|RemoteRead, m.Access(), "access untouched")
	_, err = tb.Lookup(m.RKey(), RKey, pd, m.IOVA(), 8, RemoteRead)
	require.ErrorIs(t, err, ErrPDMismatch)
	require.ErrorIs(t, pd2.Dealloc(), ErrPDBusy)

	// Translation: new buffer at an explicit IOVA; then default IOVA.
	buf2 := alignedBuf(32)
	require.NoError(t, m.Rereg(ReregTranslation, nil, buf2, 0, WithIOVA(0x5000)))
	require.Equal(t, uint64(0x5000), m.IOVA())
	require.Equal(t, 32, m.Len())
	reg, err = tb.Lookup(m.RKey(), RKey, pd2, 0x5008, 8, RemoteRead)
	require.NoError(t, err)
	require.True(t, samePtr(reg.Bytes(), buf2[8:]))
	reg.Release()
	require.NoError(t, m.Rereg(ReregTranslation|ReregAccess|ReregPD, pd, buf, LocalWrite|RemoteWrite))
	require.Equal(t, addrOf(buf), m.IOVA())
	require.Equal(t, pd, m.PD())

	// A Region held across all of this still refers to the first version.
	require.True(t, samePtr(held.Bytes(), buf))
	held.Release()

	// Failures change nothing.
	before := snap(tb, m)
	require.ErrorIs(t, m.Rereg(ReregAccess, nil, nil, RemoteAtomic), ErrAccessCombo)
	require.ErrorIs(t, m.Rereg(ReregTranslation, nil, nil, 0), ErrEmptyBuffer)
	require.ErrorIs(t, m.Rereg(ReregTranslation, nil, buf, 0, WithIOVA(^uint64(0))), ErrIOVAOverflow)
	require.ErrorIs(t, m.Rereg(ReregPD, nil, nil, 0), ErrBadPD)
	require.ErrorIs(t, m.Rereg(0, nil, nil, 0), ErrInvalidArgument)
	require.ErrorIs(t, m.Rereg(8, nil, nil, 0), ErrInvalidArgument)
	require.Equal(t, before, snap(tb, m))
	reg, err = tb.Lookup(m.RKey(), RKey, pd, m.IOVA(), 64, RemoteWrite)
	require.NoError(t, err)
	reg.Release()

	require.NoError(t, pd2.Dealloc(), "region moved back to pd")
	require.NoError(t, m.Dereg())
	require.NoError(t, pd.Dealloc())
	require.Contains(t, m.String(), "deregistered")
}
