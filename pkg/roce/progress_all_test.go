package roce

import (
	"runtime"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/stretchr/testify/require"
)

// A spinner on one engine receives for another engine of the process
// that nobody polls: b's Conn delivers only to pollers (polltest.Only), b
// itself is never polled, and a's ProgressOthers alone brings a's SEND
// into b's receive queue and b's ACK back to a.
func TestProgressOthersReceivesForAnUnpolledEngine(t *testing.T) {
	a := newUDPSide(t, "127.0.0.1", false)
	b := newUDPSide(t, "127.0.0.1", true)
	connectUDP(t, a, b)
	amr, abuf := regMR(t, a, 4096)
	bmr, bbuf := regMR(t, b, 4096)
	_, err := b.e.PostRecv(b.q, []qp.RecvWR{{ID: 7, SGL: []qp.SGE{{Addr: bmr.IOVA(), Length: 64, LKey: bmr.LKey()}}}})
	require.NoError(t, err)
	copy(abuf, "for b")
	_, err = a.e.PostSend(a.q, []qp.SendWR{{ID: 1, Opcode: qp.WRSend, Flags: qp.Signaled,
		SGL: []qp.SGE{{Addr: amr.IOVA(), Length: 5, LKey: amr.LKey()}}}})
	require.NoError(t, err)

	deadline := time.Now().Add(10 * time.Second)
	var wc [1]qp.WC
	took := 0
	for b.rcq.Poll(wc[:]) == 0 {
		took += ProgressOthers(a.e)
		require.False(t, time.Now().After(deadline), "b's receive did not complete (ProgressOthers took %d packets)", took)
		runtime.Gosched()
	}
	require.Equal(t, qp.WCSuccess, wc[0].Status)
	require.EqualValues(t, 7, wc[0].ID)
	require.Equal(t, "for b", string(bbuf[:5]))
	require.Positive(t, took)
	require.Zero(t, b.e.polledAt.Load(), "b was never polled by its own application")
	// b's ACK completes a's SEND through a's own receive loop.
	require.Equal(t, qp.WCSuccess, waitWC(t, a.scq).Status)
}

// An engine its own application has just polled is left to it; one never
// polled, or not for a while, is helped.
func TestOwnPollerActive(t *testing.T) {
	const now = int64(10 * time.Second)
	for _, c := range []struct {
		polledAt int64
		want     bool
	}{
		{0, false},                              // never polled
		{now, true},                             // polled just now
		{now - int64(ownPollRecent), true},      // at the bound
		{now - int64(ownPollRecent) - 1, false}, // just past it
		{now - int64(time.Second), false},       // long ago
	} {
		require.Equal(t, c.want, ownPollerActive(now, c.polledAt), "polled at %d", c.polledAt)
	}
}
