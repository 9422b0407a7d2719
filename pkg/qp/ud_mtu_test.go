package qp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// udSend posts one UD SEND of n bytes from a to b.
func (l *link) udSend(id uint64, n int) {
	l.t.Helper()
	for i := range n {
		l.a.buf[i] = byte(i*13 + 1)
	}
	require.NoError(l.t, l.a.q.PostSend(&SendWR{ID: id, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, n)},
		RemoteQPN: l.b.q.Num(), RemoteQKey: 0x1234, AV: AddrVector{DGID: l.b.addr.Addr()}}))
	l.a.q.Run(l.a.env, l.now, 1000)
}

// UD uses the port's active MTU (rxe get_mtu: qp->mtu is for RC/UC
// only), 4096 by default: a 4096-byte message (ibv_ud_pingpong -s 4096)
// is one packet and arrives whole after the 40 GRH bytes.
//
// Regression test: was TestRegressUDUsesPortMTU in regress_udmtu_test.go
// (added in commit 77b8bdc).
func TestUDUsesPortMTU(t *testing.T) {
	l := newLink(t, UD, 0, 0) // path MTU 256 is set on the link but means nothing to UD
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 7, SGL: []SGE{l.b.sge(0, 40+4096)}}))
	l.udSend(1, 4096)
	pk := l.a.env.take()
	require.Len(t, pk, 1, "one UD packet per message")
	l.deliver(l.b, l.a, pk...)
	wc := poll(t, l.b.rcq)
	require.Len(t, wc, 1)
	require.Equal(t, WCSuccess, wc[0].Status)
	require.Equal(t, uint32(40+4096), wc[0].ByteLen)
	require.Equal(t, l.a.buf[:4096], l.b.buf[40:40+4096])
	swc := poll(t, l.a.scq)
	require.Len(t, swc, 1)
	require.Equal(t, WCSuccess, swc[0].Status)
}

// A UD message longer than the port MTU is not sent and completes with
// SUCCESS, and the QP carries on: IBA C10-93.1.1 forbids both a packet
// and an error for it, and rxe_requester "fakes a successful UD send"
// (one PSN, no packet). rxed completed it with LOC_LEN_ERR, which moved
// the UD QP to ERR and flushed everything posted after it.
//
// Regression test: was TestRegressUDLongerThanMTUFailsLocally in regress_udmtu_test.go
// (added in commit 77b8bdc), which wanted LOC_LEN_ERR.
func TestUDLongerThanMTUCompletesUnsent(t *testing.T) {
	l := newLinkPortMTU(t, MTU1024)
	first := l.a.q.Attr().SQPSN
	l.udSend(1, 1025)
	require.Empty(t, l.a.env.take(), "no packet for it")
	wc := poll(t, l.a.scq)
	require.Len(t, wc, 1)
	require.Equal(t, uint64(1), wc[0].ID)
	require.Equal(t, WCSuccess, wc[0].Status)
	require.Equal(t, RTS, l.a.q.State())

	// The next message goes out, one PSN on, and arrives.
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 7, SGL: []SGE{l.b.sge(0, 40+1024)}}))
	l.udSend(2, 1024)
	pk := l.a.env.take()
	require.Len(t, pk, 1)
	require.Equal(t, []PSN{first.Next()}, psns(pk), "the unsent message took one PSN")
	l.deliver(l.b, l.a, pk...)
	rwc := poll(t, l.b.rcq)
	require.Len(t, rwc, 1)
	require.Equal(t, WCSuccess, rwc[0].Status)
	require.Equal(t, uint32(40+1024), rwc[0].ByteLen)
	swc := poll(t, l.a.scq)
	require.Len(t, swc, 1)
	require.Equal(t, uint64(2), swc[0].ID)
	require.Equal(t, WCSuccess, swc[0].Status)
}

// A lowered port MTU still carries messages up to it in one packet.
//
// Regression test: was TestRegressUDLoweredPortMTU in regress_udmtu_test.go
// (added in commit 77b8bdc).
func TestUDLoweredPortMTU(t *testing.T) {
	l := newLinkPortMTU(t, MTU1024)
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 7, SGL: []SGE{l.b.sge(0, 40+1024)}}))
	l.udSend(1, 1024)
	pk := l.a.env.take()
	require.Len(t, pk, 1)
	l.deliver(l.b, l.a, pk...)
	wc := poll(t, l.b.rcq)
	require.Len(t, wc, 1)
	require.Equal(t, WCSuccess, wc[0].Status)
	require.Equal(t, uint32(40+1024), wc[0].ByteLen)
}

// A received UD message larger than the posted buffer completes with
// LOC_LEN_ERR, never truncated with SUCCESS; the QP keeps working.
//
// Regression test: was TestRegressUDReceiveLongerThanBuffer in regress_udmtu_test.go
// (added in commit 77b8bdc).
func TestUDReceiveLongerThanBuffer(t *testing.T) {
	l := newLink(t, UD, 0, 0)
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 7, SGL: []SGE{l.b.sge(0, 40+2000)}}))
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 8, SGL: []SGE{l.b.sge(0, 40+4096)}}))
	l.udSend(1, 3000)
	l.deliver(l.b, l.a, l.a.env.take()...)
	wc := poll(t, l.b.rcq)
	require.Len(t, wc, 1)
	require.Equal(t, uint64(7), wc[0].ID)
	require.Equal(t, WCLocLenErr, wc[0].Status)
	l.udSend(2, 3000)
	l.deliver(l.b, l.a, l.a.env.take()...)
	wc = poll(t, l.b.rcq)
	require.Len(t, wc, 1)
	require.Equal(t, uint64(8), wc[0].ID)
	require.Equal(t, WCSuccess, wc[0].Status)
	require.Equal(t, uint32(40+3000), wc[0].ByteLen)
}

// newLinkPortMTU is newLink(UD) on a port whose active MTU is m.
func newLinkPortMTU(t *testing.T, m MTU) *link {
	l := newLink(t, UD, 0, 0)
	for _, e := range []*end{l.a, l.b} {
		q, err := New(Config{Num: e.q.Num(), Type: UD, PD: e.pd, Mem: e.mem, SendCQ: e.scq, RecvCQ: e.rcq,
			PortMTU: m, Cap: Cap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 4, MaxRecvSGE: 4}})
		require.NoError(t, err)
		for _, st := range []State{Init, RTR, RTS} {
			mask := AttrState
			switch st {
			case Init:
				mask |= AttrPKeyIndex | AttrPort | AttrQKey
			case RTS:
				mask |= AttrSQPSN
			}
			require.NoError(t, q.Modify(&Attr{State: st, PortNum: 1, QKey: 0x1234}, mask, l.now))
		}
		e.q = q
	}
	return l
}
