//go:build unix

package mr

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Bug (found by the memory audit, session AF): the memory given to a
// fast-registration region's Map (ib_map_mr_sg) did not pin the mapping it
// lay in; only a region version did, from REG_MR to LOCAL_INV. So the
// mapping could be closed (munmap) between Map and the REG_MR, or after a
// LOCAL_INV while the region kept it mapped for the next REG_MR; that
// REG_MR then found no open mapping to pin and made the region valid over
// unmapped memory, and a peer's WRITE or READ through its rkey crashed the
// process (SIGSEGV in the worker) instead of failing. Map now pins the
// mapping until the region maps something else or is deregistered, so
// Close fails with ErrMappingBusy meanwhile.
func TestFastRegionMappedMemoryPinsItsMapping(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	mp, err := MapAnonymous(2 * pageSize)
	require.NoError(t, err)
	fmr, err := tb.AllocFastMR(pd, pageSize)
	require.NoError(t, err)
	require.NoError(t, fmr.Map(mp.Bytes()[:pageSize]))
	require.ErrorIs(t, mp.Close(), ErrMappingBusy, "mapped by a free fast region")

	// Through a REG_MR and a LOCAL_INV, the mapping stays pinned.
	key := IncKey(fmr.LKey())
	require.NoError(t, tb.RegMapped(pd, fmr.LKey(), key, LocalWrite|RemoteWrite, 0, 0))
	require.NoError(t, tb.Invalidate(pd, NoQP, key))
	require.ErrorIs(t, mp.Close(), ErrMappingBusy, "still mapped for the next REG_MR")

	// Mapping other memory lets it go; mapping it again pins it again.
	require.NoError(t, fmr.Map(make([]byte, 64)))
	mp2, err := MapAnonymous(pageSize)
	require.NoError(t, err)
	require.NoError(t, fmr.Map(mp2.Bytes()))
	require.NoError(t, mp.Close())
	require.ErrorIs(t, mp2.Close(), ErrMappingBusy)
	require.NoError(t, fmr.Dereg())
	require.NoError(t, mp2.Close(), "Dereg let it go")
}
