package qp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSendCQOverflowLeavesTheQPRunning: a send completion that finds its
// CQ full is lost, the CQ marked overflowed (the caller raises CQ_ERR),
// and the QP carries on in RTS: rxe_comp.c's do_complete ignores
// rxe_cq_post's -EBUSY, unlike the responder's RESPST_ERR_CQ_OVERFLOW
// (TestRecvCQOverflowIsNotAcked). Once polled, the CQ takes completions
// again; Poll reports no error of its own.
func TestSendCQOverflowLeavesTheQPRunning(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	small, err := NewCQ(1)
	require.NoError(t, err)
	l.a.q.scq = small
	write := func(id uint64) SendWR {
		return SendWR{ID: id, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 8)},
			RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()}
	}
	l.post(write(1), write(2))
	l.deliver(l.b, l.a, l.a.env.take()...)
	l.deliver(l.a, l.b, l.b.env.take()...)
	require.True(t, small.Overflowed())
	require.Equal(t, RTS, l.a.q.State(), "a lost send completion does not fail the QP")
	wcs := poll(t, small)
	require.Len(t, wcs, 1)
	require.Equal(t, uint64(1), wcs[0].ID)
	require.Equal(t, WCSuccess, wcs[0].Status)

	l.post(write(3))
	l.deliver(l.b, l.a, l.a.env.take()...)
	l.deliver(l.a, l.b, l.b.env.take()...)
	wcs = poll(t, small)
	require.Len(t, wcs, 1)
	require.Equal(t, uint64(3), wcs[0].ID)
	require.Equal(t, WCSuccess, wcs[0].Status)
}
