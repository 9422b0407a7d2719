package qp

import (
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// Bug (found by the protocol audit, session AF): the responder answered
// a duplicate SEND or WRITE with an ACK for the PSN before the one it
// expects, which after a READ is that READ's last response PSN. rxe
// acknowledges at ack_psn-1 (the last SEND, WRITE or atomic it executed;
// read_reply does not move ack_psn). The difference is not cosmetic: an
// rxe requester that holds that READ's responses up to its last one
// (comp.psn at the READ's last PSN, comp.opcode READ_RESPONSE_MIDDLE)
// takes an RC ACK at comp.psn as a broken READ response sequence
// (check_ack: COMPST_ERROR) and moves its QP to ERR, so one duplicated
// SEND packet on the wire killed an rxe peer's connection.
func TestDuplicateSendAfterReadIsAckedAtTheSend(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{l.b.sge(8192, 64)}}))
	l.post(SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 10)}},
		SendWR{ID: 2, Opcode: WRRDMARead, Flags: Signaled, SGL: []SGE{l.a.sge(0, 1000)},
			RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()})
	req := l.a.env.take()
	require.Equal(t, []wire.Opcode{wire.RCSendOnly, wire.RCReadRequest}, opcodes(req))
	l.deliver(l.b, l.a, req...)
	resp := l.b.env.take()
	require.Equal(t, []wire.Opcode{wire.RCAck, wire.RCReadResponseFirst, wire.RCReadResponseMiddle,
		wire.RCReadResponseMiddle, wire.RCReadResponseLast}, opcodes(resp))

	// The SEND again (duplicated on the wire, or resent): acknowledged
	// at its own PSN, as rxe's duplicate_request does, not at the READ's
	// last response PSN.
	l.deliver(l.b, l.a, req[0])
	dup := l.b.env.take()
	require.Len(t, dup, 1)
	var p wire.Packet
	require.NoError(t, p.Parse(dup[0]))
	require.Equal(t, wire.RCAck, p.Opcode)
	require.Equal(t, wire.SynACK, p.AETH.Syndrome().Kind())
	require.Equal(t, PSN(wire.BTH(req[0]).PSN()), PSN(p.BTH.PSN()))
	require.Equal(t, uint64(1), l.b.q.ctr.DuplicateRequest.Load())
	require.Len(t, poll(t, l.b.rcq), 1, "the SEND was received once")

	// A later SEND moves it on.
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 2, SGL: []SGE{l.b.sge(8192, 64)}}))
	l.post(SendWR{ID: 3, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 10)}})
	next := l.a.env.take()
	l.deliver(l.b, l.a, next...)
	l.b.env.take()
	l.deliver(l.b, l.a, req[0])
	dup = l.b.env.take()
	require.Len(t, dup, 1)
	require.NoError(t, p.Parse(dup[0]))
	require.Equal(t, PSN(wire.BTH(next[0]).PSN()), PSN(p.BTH.PSN()))
}
