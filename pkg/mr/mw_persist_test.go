//go:build unix

package mr

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Bug (found by the memory audit, session AF): a window could grant
// FLUSH_PERSISTENT over a region of ordinary memory, which RegMR and
// REG_MR refuse that right (only a writable file mapping can be made
// durable). A peer's FLUSH to persistence through such a window was then
// ACKed after a Persist that had nothing to msync: the requester was told
// its bytes were durable when nothing could make them so. BindMW now
// refuses the right over memory that cannot be persisted (MW_BIND_ERR).
func TestWindowCannotGrantPersistenceOverVolatileMemory(t *testing.T) {
	f := newMWFixture(t, LocalWrite|RemoteWrite|MWBind)
	w, err := f.tb.AllocMW(f.pd, MWType1)
	require.NoError(t, err)
	_, err = w.Bind(f.mr, f.mr.IOVA(), 64, RemoteWrite|FlushPersistent)
	require.ErrorIs(t, err, ErrBind)
	require.ErrorIs(t, err, ErrUnsupportedAccess)
	require.False(t, w.Bound())
	_, err = w.Bind(f.mr, f.mr.IOVA(), 64, RemoteWrite|FlushGlobal)
	require.NoError(t, err, "global visibility is fine")

	// Over a writable file mapping the window may grant it, even when the
	// region itself does not.
	mp, err := CreateMapFile(filepath.Join(t.TempDir(), "pmem"), pageSize)
	require.NoError(t, err)
	m, err := f.tb.RegMR(f.pd, mp.Bytes(), LocalWrite|RemoteWrite|MWBind)
	require.NoError(t, err)
	key, err := w.Bind(m, m.IOVA(), 64, RemoteWrite|FlushPersistent)
	require.NoError(t, err)
	reg, err := f.tb.LookupFlushQP(key, f.pd, NoQP, 0, 0, FlushPersistent, true)
	require.NoError(t, err)
	require.NoError(t, reg.Persist())
	reg.Release()
	require.NoError(t, w.Dealloc())
	require.NoError(t, m.Dereg())
	require.NoError(t, mp.Close())
}
