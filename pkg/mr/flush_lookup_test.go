package mr

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// LookupFlushQP (the FLUSH target, after rxe's check_rkey and
// process_flush): the key is checked even for zero bytes, an empty range
// may sit at the end, and a whole-region FLUSH covers the region, or a
// window's bound range, wherever its VA points.
func TestLookupFlushQP(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	buf := alignedBuf(4096)
	m, err := tb.RegMR(pd, buf, LocalWrite|RemoteWrite|RemoteAtomic|MWBind|FlushGlobal)
	require.NoError(t, err)
	plain, err := tb.RegMR(pd, alignedBuf(64), LocalWrite)
	require.NoError(t, err)

	_, err = tb.LookupFlushQP(IncKey(m.RKey()), pd, NoQP, m.IOVA(), 0, FlushGlobal, false)
	require.ErrorIs(t, err, ErrInvalidKey)
	_, err = tb.LookupFlushQP(plain.RKey(), pd, NoQP, plain.IOVA(), 0, FlushGlobal, false)
	require.ErrorIs(t, err, ErrAccess)
	_, err = tb.LookupFlushQP(m.RKey(), pd, NoQP, m.IOVA()+4097, 0, FlushGlobal, false)
	require.ErrorIs(t, err, ErrRange)
	reg, err := tb.LookupFlushQP(m.RKey(), pd, NoQP, m.IOVA()+4096, 0, FlushGlobal, false)
	require.NoError(t, err)
	require.Zero(t, reg.Len())
	reg.Release()

	reg, err = tb.LookupFlushQP(m.RKey(), pd, NoQP, 0, 1<<40, FlushGlobal, true)
	require.NoError(t, err)
	require.Equal(t, 4096, reg.Len())
	require.Equal(t, unsafe.SliceData(buf), unsafe.SliceData(reg.Bytes()))
	reg.Release()

	w, err := tb.AllocMW(pd, MWType1)
	require.NoError(t, err)
	key, err := w.Bind(m, m.IOVA()+1024, 256, FlushGlobal)
	require.NoError(t, err)
	reg, err = tb.LookupFlushQP(key, pd, NoQP, 0, 0, FlushGlobal, true)
	require.NoError(t, err)
	require.Equal(t, 256, reg.Len())
	require.Equal(t, &buf[1024], unsafe.SliceData(reg.Bytes()))
	reg.Release()
	reg, err = tb.LookupFlushQP(key, pd, NoQP, m.IOVA()+1024+256, 0, FlushGlobal, false)
	require.NoError(t, err)
	require.Zero(t, reg.Len())
	reg.Release()
	_, err = tb.LookupFlushQP(key, pd, NoQP, m.IOVA()+1024+257, 0, FlushGlobal, false)
	require.ErrorIs(t, err, ErrRange)
	_, err = tb.LookupFlushQP(key, pd, NoQP, m.IOVA(), 8, FlushGlobal, false)
	require.ErrorIs(t, err, ErrRange)

	// An atomic right asked of an empty range fails instead of panicking.
	_, err = tb.LookupFlushQP(m.RKey(), pd, NoQP, m.IOVA(), 0, RemoteAtomic, false)
	require.ErrorIs(t, err, ErrAlign)
	require.NoError(t, w.Dealloc())
	require.NoError(t, m.Dereg())
	require.NoError(t, plain.Dereg())
}
