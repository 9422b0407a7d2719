package daemon

import (
	"net/netip"
	"testing"

	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/stretchr/testify/require"
)

// TestCMWaitersOldestFirst: a test connection goes to its address's
// oldest waiting session, another address's goes nowhere, and a session
// that left gets nothing more.
func TestCMWaitersOldestFirst(t *testing.T) {
	var w cmWaiters
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	first, second := w.add(a), w.add(a)
	r1, r2 := &rdmacm.Request{}, &rdmacm.Request{}
	require.True(t, w.deliver(a, r1))
	require.Same(t, r1, <-first)
	require.False(t, w.deliver(b, r2), "no session of %v waits", b)
	w.remove(a, first)
	require.True(t, w.deliver(a, r2))
	require.Same(t, r2, <-second)
	w.remove(a, second)
	require.False(t, w.deliver(a, r1))
	require.Empty(t, w.m)
}
