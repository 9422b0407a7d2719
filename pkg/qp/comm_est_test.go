package qp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCommEstOnFirstRequestTaken: a connected QP raises the
// communication-established event (Config.OnCommEst) once, for the first
// request its responder takes in sequence, in RTR or RTS; a request out of
// sequence before it does not, nor a duplicate, nor anything after; a move
// through RESET arms it again. UD raises none (IBA suppresses it there).
//
// Bug (CM task, session AG): no event existed, so rdma_cm's passive side
// whose RTU was lost waited for the REP's retransmission (4 s) although
// the peer's first SEND had arrived.
func TestCommEstOnFirstRequestTaken(t *testing.T) {
	t.Run("RC", func(t *testing.T) {
		l := newLink(t, RC, 7, 7)
		n := 0
		l.b.q.onCommEst = func(q *QP) {
			require.Same(t, l.b.q, q)
			n++
		}
		l.post(SendWR{ID: 1, Opcode: WRRDMAWrite, SGL: []SGE{l.a.sge(0, 600)}, RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()})
		req := l.a.env.take()
		require.Len(t, req, 3)
		l.deliver(l.b, l.a, req[1]) // out of sequence: NAKed, not taken
		require.Zero(t, n, "a request out of sequence establishes nothing")
		l.deliver(l.b, l.a, req[0])
		require.Equal(t, 1, n)
		l.deliver(l.b, l.a, req[1], req[2], req[0]) // the rest, then a duplicate
		require.Equal(t, 1, n, "once per connection")

		// Both through RESET again, B left in RTR: a new connection, a
		// new event.
		for _, e := range []*end{l.a, l.b} {
			peer := l.a
			if e == l.a {
				peer = l.b
			}
			require.NoError(t, e.q.Modify(&Attr{State: Reset}, AttrState, l.now))
			require.NoError(t, e.q.Modify(&Attr{State: Init, PortNum: 1,
				AccessFlags: AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic}, l.initMask(RC), l.now))
			require.NoError(t, e.q.Modify(&Attr{State: RTR, AV: AddrVector{DGID: peer.addr.Addr()}, PathMTU: MTU256,
				DestQPN: peer.q.Num(), RQPSN: 0x100, MaxDestRdAtomic: 4, MinRNRTimer: 3},
				AttrState|AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRdAtomic|AttrMinRNRTimer, l.now))
		}
		require.NoError(t, l.a.q.Modify(&Attr{State: RTS, SQPSN: 0x100, Timeout: 10, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4},
			AttrState|AttrSQPSN|AttrTimeout|AttrRetryCnt|AttrRNRRetry|AttrMaxQPRdAtomic, l.now))
		require.Equal(t, RTR, l.b.q.State())
		l.post(SendWR{ID: 2, Opcode: WRRDMAWrite, SGL: []SGE{l.a.sge(0, 8)}, RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()})
		l.deliver(l.b, l.a, l.a.env.take()...)
		require.Equal(t, 2, n, "taken in RTR after a reset")
	})
	t.Run("UD", func(t *testing.T) {
		l := newLink(t, UD, 0, 0)
		n := 0
		l.b.q.onCommEst = func(*QP) { n++ }
		require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{l.b.sge(0, 40+256)}}))
		l.post(SendWR{ID: 1, Opcode: WRSend, SGL: []SGE{l.a.sge(0, 8)},
			AV: AddrVector{DGID: l.b.addr.Addr()}, RemoteQPN: l.b.q.Num(), RemoteQKey: 0x80000000})
		l.deliver(l.b, l.a, l.a.env.take()...)
		require.Len(t, poll(t, l.b.rcq), 1)
		require.Zero(t, n)
	})
}
