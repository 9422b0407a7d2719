package ib_test

import (
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/stretchr/testify/require"
)

// TestCommEstReachesTheQPsHandlers: the first request a connected QP takes
// raises COMM_EST once, on Device.Events and to every handler installed
// with QP.OnEvent (and not to one removed); the handlers run outside the
// engine, so one may call a verb that waits for the engine (Query) from
// inside the event.
//
// Bug (CM task, session AG): no COMM_EST existed, and a QP had no handler
// of its own, so pkg/rdmacm could not end a passive handshake whose RTU
// was lost when the peer's first SEND arrived.
func TestCommEstReachesTheQPsHandlers(t *testing.T) {
	a, b := peerPair(t, "10.8.9.1", "10.8.9.2")
	require.Equal(t, ib.EventPortActive, (<-b.dev.Events()).Type)
	qa, qb := a.createQP(ib.RC), b.createQP(ib.RC)

	got := make(chan ib.AsyncEvent, 8)
	queried := make(chan ib.QPState, 8)
	removedCalled := make(chan struct{}, 8)
	qb.OnEvent(func(ev ib.AsyncEvent) {
		attr, _, err := qb.Query() // waits for the engine's worker
		require.NoError(t, err)
		queried <- attr.State
		got <- ev
	})
	remove := qb.OnEvent(func(ib.AsyncEvent) { removedCalled <- struct{}{} })
	remove()

	connectRC(a, qa, b, qb)
	connectRC(b, qb, a, qa)
	for i := range 3 {
		require.NoError(t, qb.PostRecv(ib.RecvWR{ID: uint64(i), SGL: []ib.SGE{b.sge(0, 64)}}))
		require.NoError(t, qa.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRSend, Flags: ib.SendSignaled,
			SGL: []ib.SGE{a.sge(0, 8)}}))
		require.Equal(t, ib.WCSuccess.String(), next(b.cq).Status.String())
		require.Equal(t, ib.WCSuccess.String(), next(a.cq).Status.String())
	}
	select {
	case ev := <-got:
		require.Equal(t, ib.EventCommEst, ev.Type)
		require.Equal(t, qb.Num(), ev.QPN)
		require.Equal(t, ib.QPSRTS, <-queried)
	case <-time.After(20 * time.Second):
		t.Fatal("no COMM_EST for the QP's handler")
	}
	ev := <-b.dev.Events()
	require.Equal(t, ib.EventCommEst, ev.Type)
	require.Equal(t, qb.Num(), ev.QPN)

	// Once per connection: the later SENDs raised nothing more. The
	// device's events are queued before the handlers', so a second
	// COMM_EST would be queued by now.
	require.Empty(t, unreadEvents(t, b), "a second event")
	require.Empty(t, got)
	require.Empty(t, removedCalled, "a removed handler was called")
	// The requester's side took no request: nothing there.
	require.Equal(t, ib.EventPortActive, (<-a.dev.Events()).Type)
	require.Empty(t, unreadEvents(t, a), "the requester got an event")
}
