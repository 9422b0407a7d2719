package mr

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWindowLookupRacingUnbindAndReregistration: a window's rkey looked
// up while the window is unbound and its fast region is invalidated and
// registered again over other memory must not reach that memory with the
// window's old rights. The lookup reads the window's binding, then its
// region's state; the hook puts the unbind and the re-registration
// between the two.
//
// Bug (suspected by the memory audit, session AF; fixed in the same
// session): the lookup took a reference on whatever registration the
// region had by then, so a remote READ through the stale window read the
// new registration's memory, which granted no remote access at all.
func TestWindowLookupRacingUnbindAndReregistration(t *testing.T) {
	tb := newTestTable(t)
	pd := mustPD(t, tb)
	m, err := tb.AllocFastMR(pd, 64)
	require.NoError(t, err)
	key := IncKey(m.LKey())
	public := alignedBuf(64)
	require.NoError(t, m.FastReg(pd, key, LocalWrite|MWBind, public, 0))
	w, err := tb.AllocMW(pd, MWType1)
	require.NoError(t, err)
	wkey, err := w.Bind(m, 0, 64, RemoteRead)
	require.NoError(t, err)

	secret := alignedBuf(64)
	copy(secret, "secret")
	fired := false
	afterWindowLoad = func() {
		if fired {
			return
		}
		fired = true
		_, err := w.Bind(nil, 0, 0, 0) // unbind
		require.NoError(t, err)
		require.NoError(t, tb.Invalidate(pd, NoQP, key))
		require.NoError(t, m.FastReg(pd, IncKey(key), LocalWrite, secret, 0))
	}
	defer func() { afterWindowLoad = nil }()

	reg, err := tb.Lookup(wkey, RKey, pd, 0, 8, RemoteRead)
	require.True(t, fired)
	if err == nil {
		got := string(reg.Bytes()[:6])
		reg.Release()
		t.Fatalf("the unbound window's rkey read %q from the region's next registration", got)
	}
	require.ErrorIs(t, err, ErrInvalidKey)
}
