package qp

import (
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// TestSendWithInvalidateOfABadRKeyIsAcked: a SEND_WITH_INV whose rkey
// cannot be invalidated completes the receive with REM_INV_REQ_ERR and
// moves the responder to ERR, but the SEND itself is acknowledged, as
// rdma_rxe does (rxe_resp.c: RESPST_ERR_INVALIDATE_RKEY, "RC - Class J",
// goes through do_complete and acknowledge before the error state): the
// requester's SEND completes successfully.
//
// Bug (found by the protocol audit, session AF; fixed in the same
// session): rxed pushed the failed receive and went to ERR without an
// ACK, so the requester (an rxe one included) retried into a QP in ERR
// and failed its SEND with RETRY_EXC_ERR where rxe's peer succeeds.
func TestSendWithInvalidateOfABadRKeyIsAcked(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	l.b.q.SetRemoteInvalidate(func(_ *QP, rkey uint32) WCStatus {
		require.Equal(t, uint32(0xBAD), rkey)
		return WCRemInvReqErr
	})
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 9, SGL: []SGE{l.b.sge(0, 64)}}))
	l.post(SendWR{ID: 1, Opcode: WRSendWithInv, Flags: Signaled, InvalidateRKey: 0xBAD,
		SGL: []SGE{l.a.sge(0, 16)}})
	req := l.a.env.take()
	require.Len(t, req, 1)
	l.deliver(l.b, l.a, req...)

	rwc := poll(t, l.b.rcq)
	require.Len(t, rwc, 1)
	// wr_id, status and qp_num only (rxe's do_complete): no opcode,
	// byte_len, wc_flags nor invalidated rkey, which the failed completion
	// carried (found by the audit of UD against rxe 6.1).
	require.Equal(t, WC{ID: 9, Status: WCRemInvReqErr, QPNum: l.b.q.Num()}, rwc[0])
	require.Equal(t, Err, l.b.q.State())
	ack := l.b.env.take()
	require.Len(t, ack, 1, "the SEND is acknowledged")
	require.Equal(t, wire.RCAck, wire.BTH(ack[0]).Opcode())
	require.Equal(t, psns(req)[0], psns(ack)[0])

	l.deliver(l.a, l.b, ack...)
	swc := poll(t, l.a.scq)
	require.Len(t, swc, 1)
	require.Equal(t, WCSuccess, swc[0].Status, swc[0].Status.String())
	require.Equal(t, RTS, l.a.q.State())
}

// TestSendWithInvalidateOnUCAndUDFailsUnsent: SEND_WITH_INV is posted on
// UC and UD (rxe_wr_opcode_info lists both), but neither has a packet for
// it: rxe's next_opcode_uc and next_opcode_ud find none, the WQE fails
// with LOC_QP_OP_ERR and the QP moves to ERR, with nothing sent.
//
// Bug (found by the verbs audit, session VB): rxed refused it at post on
// UD, and on UC sent RC_SEND_ONLY_INV (an RC opcode, which the UC peer
// drops as the wrong transport) and completed the WR with SUCCESS.
func TestSendWithInvalidateOnUCAndUDFailsUnsent(t *testing.T) {
	for _, typ := range []Type{UC, UD} {
		t.Run(typ.String(), func(t *testing.T) {
			l := newLink(t, typ, 0, 0)
			l.post(SendWR{ID: 1, Opcode: WRSendWithInv, Flags: Signaled, InvalidateRKey: 0x1234,
				SGL: []SGE{l.a.sge(0, 16)}, RemoteQPN: l.b.q.Num(), AV: AddrVector{DGID: l.b.addr.Addr()}})
			require.Empty(t, l.a.env.take(), "no packet")
			wc := poll(t, l.a.scq)
			require.Len(t, wc, 1)
			require.Equal(t, uint64(1), wc[0].ID)
			require.Equal(t, WCLocQPOpErr, wc[0].Status)
			require.Equal(t, Err, l.a.q.State())
		})
	}
}
