package daemon

import (
	"context"
	"net/netip"
	"testing"

	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/stretchr/testify/require"
)

// TestCMWaitersOneWindowPerAddress: a test connection goes to the one
// session of its address waiting for test connections, another
// address's goes nowhere; a second session of the address opens its
// window only once the first has closed its own, and a session whose
// control connection has ended takes nothing (the request is a new
// client's). Bug (TestRDMACMConcurrentClientsOfOneAddress, session AG):
// two sessions of one address waited at once, and the older took the
// other's test connections.
func TestCMWaitersOneWindowPerAddress(t *testing.T) {
	var w cmWaiters
	ctx := context.Background()
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	live := make(chan struct{})
	first, err := w.open(ctx, a, live, nil)
	require.NoError(t, err)
	r1, r2 := &rdmacm.Request{}, &rdmacm.Request{}
	require.True(t, w.deliver(a, r1))
	require.Same(t, r1, <-first)
	require.False(t, w.deliver(b, r2), "no session of %v waits", b)

	waited := make(chan struct{})
	opened := make(chan chan *rdmacm.Request, 1)
	go func() {
		ch, _ := w.open(ctx, a, live, func() { close(waited) }) // ctx never ends: no error
		opened <- ch
	}()
	<-waited
	select {
	case <-opened:
		t.Fatal("a second window of one address opened while the first was open")
	default:
	}
	w.end(a, first, rejectTestConn)
	second := <-opened
	require.True(t, w.deliver(a, r2))
	require.Same(t, r2, <-second)

	// A window whose control connection ended takes nothing.
	ended := make(chan struct{})
	close(ended)
	w.end(a, second, rejectTestConn)
	third, err := w.open(ctx, a, ended, nil)
	require.NoError(t, err)
	require.False(t, w.deliver(a, r1), "a session whose client is gone took a request")
	w.end(a, third, rejectTestConn)

	// A wait ends with its context.
	fourth, err := w.open(ctx, a, live, nil)
	require.NoError(t, err)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = w.open(cctx, a, live, nil)
	require.ErrorIs(t, err, context.Canceled)
	w.end(a, fourth, rejectTestConn)
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
	ctx := context.Background()
	a := netip.MustParseAddr("10.0.0.1")
	ch, err := w.open(ctx, a, make(chan struct{}), nil)
	require.NoError(t, err)
	r1, r2, r3 := &rdmacm.Request{}, &rdmacm.Request{}, &rdmacm.Request{}
	require.True(t, w.deliver(a, r1))
	require.True(t, w.deliver(a, r2))
	var rejected []*rdmacm.Request
	reject := func(r *rdmacm.Request) { rejected = append(rejected, r) }
	w.end(a, ch, reject)
	require.Len(t, rejected, 2)
	require.Same(t, r1, rejected[0])
	require.Same(t, r2, rejected[1])
	other, err := w.open(ctx, a, make(chan struct{}), nil)
	require.NoError(t, err)
	require.True(t, w.deliver(a, r3))
	require.Same(t, r3, <-other, "the next session of the address gets what comes after")
	w.end(a, ch, reject) // a second end (the deferred one) answers nothing twice, nor closes the other's window
	require.Len(t, rejected, 2)
	require.True(t, w.deliver(a, r1), "ending an old window closed the next one's")
	require.Same(t, r1, <-other)
	w.end(a, other, reject)
	require.False(t, w.deliver(a, r1))
	require.Empty(t, w.m)
}
