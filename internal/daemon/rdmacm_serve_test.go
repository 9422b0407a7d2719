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

// TestCMWaitersEndAnswersWhatIsQueued: a session that ends, on success or
// on an error, answers every test connection still queued for it, and
// gets nothing more. Bug (found by an audit of hangs, session AE): a
// session that failed (a perftest -R client that sent its REQs and
// vanished) dropped its queue unanswered, leaving each request half open
// in the CM for good, each holding one of its 1024 half-open slots.
func TestCMWaitersEndAnswersWhatIsQueued(t *testing.T) {
	var w cmWaiters
	a := netip.MustParseAddr("10.0.0.1")
	ch, other := w.add(a), w.add(a)
	r1, r2, r3 := &rdmacm.Request{}, &rdmacm.Request{}, &rdmacm.Request{}
	require.True(t, w.deliver(a, r1))
	require.True(t, w.deliver(a, r2))
	var rejected []*rdmacm.Request
	reject := func(r *rdmacm.Request) { rejected = append(rejected, r) }
	w.end(a, ch, reject)
	require.Len(t, rejected, 2)
	require.Same(t, r1, rejected[0])
	require.Same(t, r2, rejected[1])
	require.True(t, w.deliver(a, r3))
	require.Same(t, r3, <-other, "the next session of the address gets what comes after")
	w.end(a, ch, reject) // a second end (the deferred one) answers nothing twice
	require.Len(t, rejected, 2)
	w.end(a, other, reject)
	require.False(t, w.deliver(a, r1))
	require.Empty(t, w.m)
}
