package ib_test

import (
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/stretchr/testify/require"
)

// TestQPFatalComesAfterItsCompletions: a QP that a remote error takes to
// ERR completes the failed WR and flushes every other outstanding one,
// sends then receives, each in posting order, before its QP_FATAL is
// raised, so a handler of the event finds all of them in the CQ. rdma_rxe
// (Linux 6.1) raises no event at all here (rxe_qp_error dispatches
// none); rxed's QP_FATAL is its own, see EventQPFatal.
func TestQPFatalComesAfterItsCompletions(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	queued := make(chan int, 4)
	defer qa.OnEvent(func(ev ib.AsyncEvent) {
		if ev.Type == ib.EventQPFatal {
			queued <- a.cq.Len()
		}
	})()
	require.NoError(t, qa.PostRecv(ib.RecvWR{ID: 20, SGL: []ib.SGE{a.sge(0, 64)}},
		ib.RecvWR{ID: 21, SGL: []ib.SGE{a.sge(64, 64)}}))
	require.NoError(t, qa.PostSend(
		ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled, SGL: []ib.SGE{a.sge(0, 8)},
			RemoteAddr: b.mr.IOVA() + uint64(len(b.buf)), RKey: b.mr.RKey()},
		ib.SendWR{ID: 2, Opcode: ib.WRSend, SGL: []ib.SGE{a.sge(0, 8)}},
		ib.SendWR{ID: 3, Opcode: ib.WRSendWithImm, Flags: ib.SendSignaled, SGL: []ib.SGE{a.sge(0, 8)}}))

	select {
	case n := <-queued:
		require.Equal(t, 5, n, "the event came before the completions that caused it")
	case <-time.After(20 * time.Second):
		t.Fatal("no QP_FATAL")
	}
	var wcs [8]ib.WC
	n := a.cq.Poll(wcs[:])
	type got struct {
		id uint64
		st ib.WCStatus
	}
	var all []got
	for _, wc := range wcs[:n] {
		all = append(all, got{wc.ID, wc.Status})
		require.Equal(t, qa.Num(), wc.QPNum)
	}
	require.Equal(t, []got{{1, ib.WCRemAccessErr}, {2, ib.WCWRFlushErr}, {3, ib.WCWRFlushErr},
		{20, ib.WCWRFlushErr}, {21, ib.WCWRFlushErr}}, all)
}
