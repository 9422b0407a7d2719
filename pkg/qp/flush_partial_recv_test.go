package qp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFlushPartiallyFilledRecv: a multi-packet SEND has started to
// fill a receive WR (already taken off the RQ) when the QP moves to ERR.
// That WR must still complete, with WR_FLUSH_ERR and before the WRs behind
// it, as rxe's flush does; it used to vanish without a completion.
//
// Regression test: was TestRegressFlushPartiallyFilledRecv in regress_flushpartial_test.go
// (added in commit 70d41a8).
func TestFlushPartiallyFilledRecv(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	for id := uint64(10); id < 13; id++ {
		require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: id, SGL: []SGE{l.b.sge(int(id-10)*2048, 2048)}}))
	}
	l.post(SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 1000)}})
	req := l.a.env.take()
	require.Len(t, req, 4, "1000 bytes at MTU 256")
	l.deliver(l.b, l.a, req[0]) // SEND_FIRST only: WR 10 is partly filled
	require.Len(t, poll(t, l.b.rcq), 0)

	require.NoError(t, l.b.q.Modify(&Attr{State: Err}, AttrState, l.now))
	wcs := poll(t, l.b.rcq)
	require.Len(t, wcs, 3, "every posted receive completes, the partly filled one too")
	for i, wc := range wcs {
		require.Equal(t, uint64(10+i), wc.ID, "flushed in posting order")
		require.Equal(t, WCWRFlushErr, wc.Status)
		require.Equal(t, WCOpcode(0), wc.Opcode, "rxe fills no opcode in a failed completion")
		require.Equal(t, l.b.q.Num(), wc.QPNum)
	}
}
