package qp

import (
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// TestWriteImmWithoutReceiveIsRNRBeforeTheRKey: a WRITE_ONLY_WITH_IMM
// that finds no receive WR is answered with an RNR NAK even when its rkey
// is bad, as rdma_rxe checks the receive queue (check_resource) before
// the length and the rkey (check_rkey). Once a receive is posted, the
// retry meets the rkey check: a remote access NAK, and the receive WR
// completes with REM_ACCESS_ERR (rxe's do_complete of the WQE it held).
//
// Bug (found by the protocol audit, session AF; fixed in the same
// session): rxed checked the rkey first and sent the remote access NAK at
// once, where an rxe responder sends an RNR NAK and waits for a receive.
func TestWriteImmWithoutReceiveIsRNRBeforeTheRKey(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	l.post(SendWR{ID: 1, Opcode: WRRDMAWriteWithImm, Flags: Signaled, Imm: 7,
		SGL: []SGE{l.a.sge(0, 16)}, RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey() ^ 0xFF})
	req := l.a.env.take()
	require.Len(t, req, 1)
	l.deliver(l.b, l.a, req...)
	nak := l.b.env.take()
	require.Len(t, nak, 1)
	var p wire.Packet
	require.NoError(t, p.Parse(nak[0]))
	require.Equal(t, wire.SynRNR, p.AETH.Syndrome().Kind(), "syndrome %#x", uint8(p.AETH.Syndrome()))
	require.Equal(t, RTS, l.b.q.State())

	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 9}))
	l.deliver(l.b, l.a, req...) // the requester's retry after the RNR timer
	nak = l.b.env.take()
	require.Len(t, nak, 1)
	require.NoError(t, p.Parse(nak[0]))
	require.Equal(t, wire.NAKSyndrome(wire.NAKRemoteAccess), p.AETH.Syndrome())
	require.Equal(t, Err, l.b.q.State())
	rwc := poll(t, l.b.rcq)
	require.Len(t, rwc, 1)
	require.Equal(t, uint64(9), rwc[0].ID)
	require.Equal(t, WCRemAccessErr, rwc[0].Status, rwc[0].Status.String())
}
