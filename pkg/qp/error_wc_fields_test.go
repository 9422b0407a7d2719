package qp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestErrorCompletionsCarryOnlyWhatRxeFills: a completion whose status is
// not SUCCESS carries wr_id, status and qp_num, and zero for opcode,
// byte_len and wc_flags, as rdma_rxe fills it since Linux 5.16 ("RDMA/rxe:
// Set partial attributes when completion status != IBV_WC_SUCCESS":
// make_send_cqe sets opcode, wc_flags and byte_len only on success, and
// rxe_resp.c's do_complete likewise for a receive): ibv_poll_cq(3) says
// only those fields are valid, and a program ported from rxe sees
// IBV_WC_SEND (0) and 0 bytes in the others. Bug (event audit, session
// HCQ): rxed's send-side error and flush completions carried the WR's
// opcode, its length and WITH_IMM, and flushed receives IBV_WC_RECV.
//
// Every outstanding WR is flushed, signalled or not, in posting order on
// each queue.
func TestErrorCompletionsCarryOnlyWhatRxeFills(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	for id := uint64(20); id < 23; id++ {
		require.NoError(t, l.a.q.PostRecv(&RecvWR{ID: id, SGL: []SGE{l.a.sge(int(id-20)*512, 512)}}))
	}
	// A WRITE beyond b's region draws a remote access NAK; the WRs behind
	// it (one of them unsignalled) are flushed.
	l.post(SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 600)},
		RemoteAddr: l.b.m.IOVA() + uint64(len(l.b.buf)) - 100, RKey: l.b.m.RKey()},
		SendWR{ID: 2, Opcode: WRSendWithImm, Imm: 7, SGL: []SGE{l.a.sge(0, 100)}},
		SendWR{ID: 3, Opcode: WRRDMARead, Flags: Signaled, SGL: []SGE{l.a.sge(4096, 300)},
			RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()},
		SendWR{ID: 4, Opcode: WRRDMAWriteWithImm, Flags: Signaled, Imm: 9, SGL: []SGE{l.a.sge(0, 40)},
			RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()})
	l.deliver(l.b, l.a, l.a.env.take()[0])
	l.deliver(l.a, l.b, l.b.env.take()...)
	require.Equal(t, Err, l.a.q.State())

	want := func(id uint64, st WCStatus) WC { return WC{ID: id, Status: st, QPNum: l.a.q.Num()} }
	require.Equal(t, []WC{want(1, WCRemAccessErr), want(2, WCWRFlushErr), want(3, WCWRFlushErr), want(4, WCWRFlushErr)},
		poll(t, l.a.scq))
	require.Equal(t, []WC{want(20, WCWRFlushErr), want(21, WCWRFlushErr), want(22, WCWRFlushErr)},
		poll(t, l.a.rcq))

	// Work posted in ERR is flushed the same way.
	require.NoError(t, l.a.q.PostSend(&SendWR{ID: 5, Opcode: WRSend, SGL: []SGE{l.a.sge(0, 8)}}))
	require.NoError(t, l.a.q.PostRecv(&RecvWR{ID: 23, SGL: []SGE{l.a.sge(0, 8)}}))
	l.a.q.Run(l.a.env, l.now, 1000)
	require.Equal(t, []WC{want(5, WCWRFlushErr)}, poll(t, l.a.scq))
	require.Equal(t, []WC{want(23, WCWRFlushErr)}, poll(t, l.a.rcq))
}
