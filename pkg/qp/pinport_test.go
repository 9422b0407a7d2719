package qp

import (
	"net/netip"
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// pinPath reconnects e's QP (RESET, INIT, RTR: requests are accepted
// from RTR on) along a path to peer with the given DestPort and
// PinSrcPort.
func pinPath(t *testing.T, l *link, e, peer *end, destPort uint16, pin bool) {
	t.Helper()
	typ := e.q.Type()
	require.NoError(t, e.q.Modify(&Attr{State: Reset}, AttrState, l.now))
	require.NoError(t, e.q.Modify(&Attr{State: Init, PortNum: 1, AccessFlags: AccessRemoteWrite}, l.initMask(typ), l.now))
	av := AddrVector{DGID: peer.addr.Addr(), DestPort: destPort, PinSrcPort: pin}
	mask := AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN
	if typ == RC {
		mask |= AttrMaxDestRdAtomic | AttrMinRNRTimer
	}
	require.NoError(t, e.q.Modify(&Attr{State: RTR, AV: av, PathMTU: MTU256, DestQPN: peer.q.Num(),
		RQPSN: 0xFFFFFE, MaxDestRdAtomic: 4, MinRNRTimer: 3}, mask, l.now))
	require.Equal(t, pin, e.q.Attr().AV.PinSrcPort, "the option is part of the path")
}

func TestPinSrcPortChecksTheUDPSourcePort(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	l.post(SendWR{ID: 1, Opcode: WRSend, SGL: []SGE{l.a.sge(0, 8)}})
	pk := l.a.env.take()[0]
	var p wire.Packet
	require.NoError(t, p.Parse(pk))
	from := func(port uint16) *RecvInfo {
		return &RecvInfo{Src: netip.AddrPortFrom(l.a.addr.Addr(), port), Dst: l.b.addr}
	}
	local := l.b.addr.Addr()

	// Off (the default): any source port, as rdma_rxe's 0xC000|hash.
	require.Equal(t, DropNone, l.b.q.Check(&p, from(0xC123), local))

	pinPath(t, l, l.b, l.a, 0, true)
	require.Equal(t, DropNone, l.b.q.Check(&p, from(4791), local), "DestPort 0 pins 4791")
	for _, port := range []uint16{0xC123, 4790, 4792, 0} {
		require.Equal(t, DropAddress, l.b.q.Check(&p, from(port), local), "port %d", port)
	}
	// The address is still checked, and first.
	other := &RecvInfo{Src: netip.MustParseAddrPort("10.9.9.9:4791"), Dst: l.b.addr}
	require.Equal(t, DropAddress, l.b.q.Check(&p, other, local))

	pinPath(t, l, l.b, l.a, 5000, true)
	require.Equal(t, DropNone, l.b.q.Check(&p, from(5000), local), "the peer's engine port")
	require.Equal(t, DropAddress, l.b.q.Check(&p, from(4791), local))

	pinPath(t, l, l.b, l.a, 5000, false)
	require.Equal(t, DropNone, l.b.q.Check(&p, from(4791), local), "unpinned again")
}

func TestPinSrcPortUC(t *testing.T) {
	l := newLink(t, UC, 7, 7)
	l.post(SendWR{ID: 1, Opcode: WRSend, SGL: []SGE{l.a.sge(0, 8)}})
	pk := l.a.env.take()[0]
	var p wire.Packet
	require.NoError(t, p.Parse(pk))
	pinPath(t, l, l.b, l.a, 0, true)
	ri := RecvInfo{Src: netip.AddrPortFrom(l.a.addr.Addr(), 0xC001), Dst: l.b.addr}
	require.Equal(t, DropAddress, l.b.q.Check(&p, &ri, l.b.addr.Addr()))
	ri.Src = l.a.addr // port 4791
	require.Equal(t, DropNone, l.b.q.Check(&p, &ri, l.b.addr.Addr()))
}
