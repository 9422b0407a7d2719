package qp

import (
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// max_rd_atomic and max_dest_rd_atomic are rounded up to a power of two
// (0 stays 0) as rxe_qp_from_attr rounds them, and the QP works with
// the rounded depth: rxe_qp_to_attr copies qp->attr, so ibv_query_qp on
// rxe reads 4 back for 3, and rxe's requester has 4 READs outstanding
// (qp->req.rd_atomic). rxed kept and reported 3.
func TestRdAtomicDepthsRoundUpToAPowerOfTwo(t *testing.T) {
	for in, want := range map[uint8]uint8{0: 0, 1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 9: 16, 65: 128, 128: 128} {
		require.Equal(t, want, roundUpPow2(in), "%d", in)
	}
	l := newLink(t, RC, 7, 7)
	// SQD->SQD takes both depths on RC (qp_state_table).
	require.NoError(t, l.a.q.Modify(&Attr{State: SQD}, AttrState, l.now))
	require.NoError(t, l.a.q.Modify(&Attr{MaxRdAtomic: 3, MaxDestRdAtomic: 5}, AttrMaxQPRdAtomic|AttrMaxDestRdAtomic, l.now))
	a := l.a.q.Attr()
	require.Equal(t, uint8(4), a.MaxRdAtomic)
	require.Equal(t, uint8(8), a.MaxDestRdAtomic)
	require.NoError(t, l.a.q.Modify(&Attr{State: RTS}, AttrState, l.now))
	var wrs []SendWR
	for i := range 6 {
		wrs = append(wrs, SendWR{ID: uint64(i), Opcode: WRRDMARead, Flags: Signaled, SGL: []SGE{l.a.sge(i*8, 8)},
			RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()})
	}
	l.post(wrs...)
	reqs := l.a.env.take()
	require.Len(t, reqs, 4, "max_rd_atomic 3 reads as 4: four READs outstanding")
	for _, p := range reqs {
		require.Equal(t, wire.RCReadRequest, wire.BTH(p).Opcode())
	}
}
