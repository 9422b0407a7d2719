package roce

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// connectPin is connect with PinSrcPort on b's path (to a).
func connectPin(t *testing.T, a, b *side, pin bool) {
	t.Helper()
	for _, p := range [][2]*side{{a, b}, {b, a}} {
		l, r := p[0], p[1]
		require.NoError(t, l.e.ModifyQP(l.q, &qp.Attr{State: qp.Init, PortNum: 1, AccessFlags: allRemote},
			qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags))
		av := qp.AddrVector{DGID: r.addr, PinSrcPort: pin && l == b}
		require.NoError(t, l.e.ModifyQP(l.q, &qp.Attr{State: qp.RTR, AV: av, PathMTU: qp.MTU1024,
			DestQPN: r.q.Num(), RQPSN: 100, MaxDestRdAtomic: 16, MinRNRTimer: 1},
			qp.AttrState|qp.AttrAV|qp.AttrPathMTU|qp.AttrDestQPN|qp.AttrRQPSN|qp.AttrMaxDestRdAtomic|qp.AttrMinRNRTimer))
		require.NoError(t, l.e.ModifyQP(l.q, &qp.Attr{State: qp.RTS, SQPSN: 100, Timeout: 14, RetryCnt: 7,
			RNRRetry: 7, MaxRdAtomic: 16},
			qp.AttrState|qp.AttrSQPSN|qp.AttrTimeout|qp.AttrRetryCnt|qp.AttrRNRRetry|qp.AttrMaxQPRdAtomic))
	}
}

// TestPinSrcPortStopsSpoofedWrite: a forger that knows the peer's address,
// the QPN, the PSN and the rkey, but sends from another UDP port, writes
// into an unpinned QP's memory (RoCE has nothing against it) and is
// dropped as drop_address by a pinned one; the real peer's WRITE goes
// through in both cases. Ordering: the forged packet is queued to b before
// the real one, and both are handled by the same worker in order, so the
// real WRITE's completion means the forged one was judged.
func TestPinSrcPortStopsSpoofedWrite(t *testing.T) {
	for _, pin := range []bool{false, true} {
		t.Run(map[bool]string{false: "unpinned", true: "pinned"}[pin], func(t *testing.T) {
			net := transport.NewMemNetwork()
			a := newSide(t, net, "10.9.1.1", qp.RC)
			b := newSide(t, net, "10.9.1.2", qp.RC)
			connectPin(t, a, b, pin)
			amr, abuf := regMR(t, a, 64)
			bmr, bbuf := regMR(t, b, 64)
			copy(abuf, bytes.Repeat([]byte{0xAA}, 64))

			spoofAddr := netip.AddrPortFrom(a.addr, 0xC0DE) // a's address, not its engine port
			spoofer, err := net.Listen(spoofAddr)
			require.NoError(t, err)
			defer spoofer.Close()
			h := wire.Headers{Opcode: wire.RCWriteOnly, PKey: qp.DefaultPKey, DestQP: b.q.Num(), AckReq: true,
				PSN: 100, VA: bmr.IOVA(), RKey: bmr.RKey(), DMALen: 64}
			buf := make([]byte, qp.MaxPacketLen)
			po, n, err := h.EncodeHeaders(buf, 64)
			require.NoError(t, err)
			copy(buf[po:], bytes.Repeat([]byte{0x66}, 64))
			dst := netip.AddrPortFrom(b.addr, transport.RoCEv2Port)
			wire.Flow{Src: spoofAddr, Dst: dst}.Seal(buf[:n])
			before := b.e.Drops(qp.DropAddress)
			require.NoError(t, spoofer.Send([][]byte{buf[:n]}, transport.Endpoint{Local: spoofAddr, Remote: dst}))

			_, err = a.e.PostSend(a.q, []qp.SendWR{{ID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.Signaled,
				SGL: []qp.SGE{{Addr: amr.IOVA(), Length: 64, LKey: amr.LKey()}}, RemoteAddr: bmr.IOVA(), RKey: bmr.RKey()}})
			require.NoError(t, err)
			wc := waitWC(t, a.scq)
			require.Equal(t, qp.WCSuccess, wc.Status)
			if pin {
				require.Equal(t, abuf, bbuf, "only the real peer's bytes landed")
				require.Equal(t, before+1, b.e.Drops(qp.DropAddress), "the forged packet counted under drop_address")
			} else {
				require.Equal(t, bytes.Repeat([]byte{0x66}, 64), bbuf,
					"unpinned, the forged WRITE took the PSN and the real one was a duplicate")
				require.Equal(t, before, b.e.Drops(qp.DropAddress))
			}
		})
	}
}
