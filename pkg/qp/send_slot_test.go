package qp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// postOnPush is a send CQ whose Push immediately posts another WR, as an
// application polling the CQ the instant the completion is visible would.
type postOnPush struct {
	q    *QP
	wr   SendWR
	errs []error
	wcs  []WC
}

func (c *postOnPush) Push(wc WC) error {
	c.wcs = append(c.wcs, wc)
	c.errs = append(c.errs, c.q.PostSend(&c.wr))
	return nil
}

// A completion that is visible must already have freed its send queue
// slot: libibverbs providers retire the WQE before the CQE can be polled,
// so a post right after a poll never sees "send queue full".
//
// Regression test: was TestRegressSendSlotFreedBeforeCompletionVisible in regress_sqslot_test.go
// (added in commit 20e180a).
func TestSendSlotFreedBeforeCompletionVisible(t *testing.T) {
	for _, typ := range []Type{RC, UD} {
		t.Run(typ.String(), func(t *testing.T) {
			l := newLink(t, typ, 7, 7)
			cq := &postOnPush{q: l.a.q}
			l.a.q.scq = cq
			l.a.q.cap.MaxSendWR = 1
			l.a.q.sq.init(1, int(l.a.q.cap.MaxSendSGE), int(l.a.q.cap.MaxInlineData))
			wr := SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 8)},
				RemoteQPN: l.b.q.Num(), RemoteQKey: 0x1234, AV: AddrVector{DGID: l.b.addr.Addr()}}
			cq.wr = wr
			cq.wr.ID = 2
			require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 9, SGL: []SGE{l.b.sge(0, 256)}}))
			require.NoError(t, l.a.q.PostSend(&wr))
			l.a.q.Run(l.a.env, l.now, 100)
			l.deliver(l.b, l.a, l.a.env.take()...)
			l.deliver(l.a, l.b, l.b.env.take()...)
			require.Len(t, cq.wcs, 1)
			require.Equal(t, WCSuccess, cq.wcs[0].Status)
			require.Equal(t, uint64(1), cq.wcs[0].ID)
			require.NoError(t, cq.errs[0], "post right after the completion became visible")
		})
	}
}
