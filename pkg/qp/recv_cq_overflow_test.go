package qp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRecvCQOverflowIsNotAcked: when the receive CQ is full, the
// message whose completion cannot be delivered is not acknowledged and the
// QP moves to ERR (rxe's RESPST_ERR_CQ_OVERFLOW); it used to be ACKed, so
// the requester saw success for a completion that was lost.
//
// Regression test: was TestRegressRecvCQOverflowIsNotAcked in regress_cqoverflow_test.go
// (added in commit 5ee9b8d).
func TestRecvCQOverflowIsNotAcked(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	full, err := NewCQ(1)
	require.NoError(t, err)
	l.b.q.rcq = full
	for id := uint64(10); id < 12; id++ {
		require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: id, SGL: []SGE{l.b.sge(int(id-10)*256, 256)}}))
	}
	l.post(SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 100)}})
	first := l.a.env.take()
	l.deliver(l.b, l.a, first...)
	require.Len(t, l.b.env.take(), 1, "the first SEND is ACKed")
	require.Equal(t, RTS, l.b.q.State())

	l.post(SendWR{ID: 2, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 100)}})
	second := l.a.env.take()
	l.deliver(l.b, l.a, second...)
	require.Empty(t, l.b.env.take(), "no ACK for a message whose completion overflowed the CQ")
	require.Equal(t, Err, l.b.q.State())
	require.True(t, full.Overflowed())
}
