package roce

import (
	"testing"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// TestReceivedBatchesCountsWhatArrives: ReceivedBatches (what
// ib.HybridWaiter watches to keep spinning on a busy device) stays put
// while nothing arrives and moves on the side that receives: a WRITE's
// responder receives the request, its requester the ACK.
func TestReceivedBatchesCountsWhatArrives(t *testing.T) {
	net := transport.NewMemNetwork()
	a := newSide(t, net, "10.0.0.1", qp.RC)
	b := newSide(t, net, "10.0.0.2", qp.RC)
	connect(t, a, b, qp.MTU1024, 14)
	require.Zero(t, a.e.ReceivedBatches(), "nothing sent yet")
	require.Zero(t, b.e.ReceivedBatches(), "nothing sent yet")

	amr, _ := regMR(t, a, 64)
	bmr, _ := regMR(t, b, 64)
	_, err := a.e.PostSend(a.q, []qp.SendWR{{ID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.Signaled,
		SGL: []qp.SGE{{Addr: amr.IOVA(), Length: 64, LKey: amr.LKey()}}, RemoteAddr: bmr.IOVA(), RKey: bmr.RKey()}})
	require.NoError(t, err)
	wc := waitWC(t, a.scq) // the ACK arrived: a received, and b before it
	require.Equal(t, qp.WCSuccess, wc.Status)
	require.Positive(t, a.e.ReceivedBatches(), "the requester received the ACK")
	require.Positive(t, b.e.ReceivedBatches(), "the responder received the WRITE")
}
