package roce

import (
	"testing"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// Once DestroyQP returns, the engine sends nothing more for the QP: what
// the worker's round built before the destroy ran leaves inside it. The
// daemon stops accounting for a session's QP when its Destroy returns
// (internal/daemon retireQP); a batch built in the same round as the
// destroy used to leave after that, outside the session's send budget.
func TestForgetSendsWhatTheRoundBuilt(t *testing.T) {
	w, rc := bareWorker()
	mem := mr.NewTable(nil)
	pd, err := mem.AllocPD()
	require.NoError(t, err)
	cq, err := qp.NewCQ(4)
	require.NoError(t, err)
	newQP := func(num uint32) *qp.QP {
		q, err := qp.New(qp.Config{Num: num, Type: qp.RC, Mem: mem, PD: pd, SendCQ: cq, RecvCQ: cq})
		require.NoError(t, err)
		return q
	}
	calls := rc.callCount
	q := newQP(7)
	w.qps[7] = &qpEntry{q: q}
	// An ACK built this round (as q's responder would), not yet flushed.
	transmitToPeer(t, w, wire.RCAck, wire.ACKSyndrome(31))
	require.Zero(t, calls(), "an ACK waits for the round's flush")

	require.False(t, w.forget(newQP(7)), "another QP under the same number is not q")
	require.Contains(t, w.qps, uint32(7))
	require.Zero(t, calls(), "nor sends anything")
	require.True(t, w.forget(q))
	require.NotContains(t, w.qps, uint32(7))
	require.Equal(t, 1, calls(), "the batch left before forget returned")
	require.Len(t, rc.sent, 1)
	require.Zero(t, w.txN)
	require.False(t, w.forget(q), "forgotten once")
}
