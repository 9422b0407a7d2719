package roce

import (
	"testing"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// Bug (found by the memory audit, session AF): destroying a QP left the
// type 2 windows it had bound bound, to its QP number. pkg/mr matches a
// type 2 window to its QP by number (mr.Table.DetachQP exists for this
// very case), but nothing called DetachQP: a later QP that got the same
// number (an explicit Config.Num, or a random draw once the number left
// the held-back window) let a peer in through a window the application
// never bound on it, where rxe's window names its QP object
// (rxe_lookup_mw: mw->qp != qp). The window also stayed counted against
// its region, whose Dereg failed with ErrMWBound for good. DestroyQP now
// invalidates the QP's type 2 windows before its number is given back.
func TestDestroyedQPsType2WindowIsNotReachedThroughItsNumber(t *testing.T) {
	net := transport.NewMemNetwork()
	a := newSide(t, net, "10.0.0.1", qp.RC)
	b := newSide(t, net, "10.0.0.2", qp.RC)
	connect(t, a, b, qp.MTU1024, 14)
	amr, abuf := regMR(t, a, 4096)
	buf := make([]byte, 4096)
	region, err := b.e.Memory().RegMR(b.pd, buf, mr.LocalWrite|mr.RemoteWrite|mr.MWBind)
	require.NoError(t, err)
	mw, err := b.e.Memory().AllocMW(b.pd, mr.MWType2)
	require.NoError(t, err)
	rkey := mr.IncKey(mw.RKey())
	_, err = b.e.PostSend(b.q, []qp.SendWR{{ID: 1, Opcode: qp.WRBindMW, Flags: qp.Signaled,
		Bind: qp.MWBindInfo{MWRKey: mw.RKey(), NewRKey: rkey, MRLKey: region.LKey(), Addr: region.IOVA(),
			Length: 4096, Access: mr.RemoteWrite}}})
	require.NoError(t, err)
	wc := waitWC(t, b.scq)
	require.Equal(t, qp.WCSuccess, wc.Status, wc.Status.String())
	require.Equal(t, rkey, mw.RKey())

	num := b.q.Num()
	require.NoError(t, b.e.DestroyQP(b.q))
	require.False(t, mw.Bound(), "the window went with its QP")

	// A new QP with the old number, connected to a again.
	b.q, err = b.e.CreateQP(qp.Config{Num: num, Type: qp.RC, PD: b.pd, SendCQ: b.scq, RecvCQ: b.rcq, Cap: sideCap})
	require.NoError(t, err)
	require.NoError(t, a.e.ModifyQP(a.q, &qp.Attr{State: qp.Reset}, qp.AttrState))
	connect(t, a, b, qp.MTU1024, 14)
	copy(abuf, "through a window nobody bound here")
	_, err = a.e.PostSend(a.q, []qp.SendWR{{ID: 2, Opcode: qp.WRRDMAWrite, Flags: qp.Signaled,
		SGL: []qp.SGE{{Addr: amr.IOVA(), Length: 64, LKey: amr.LKey()}}, RemoteAddr: region.IOVA(), RKey: rkey}})
	require.NoError(t, err)
	wc = waitWC(t, a.scq)
	require.Equal(t, qp.WCRemAccessErr.String(), wc.Status.String())
	require.Equal(t, make([]byte, 64), buf[:64], "nothing written")
	require.NoError(t, region.Dereg(), "no window is bound to the region any more")
}
