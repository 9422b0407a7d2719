package roce

import (
	"bytes"
	"net/netip"
	"sync"
	"testing"
	"unsafe"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// gatherConn gives a MemNetwork Conn a GatherSender that joins the pieces
// and records how many datagrams carried a payload piece (sent from the
// registered memory in place).
type gatherConn struct {
	transport.Conn
	mu       sync.Mutex
	inPlace  int
	whole    int
	payloads [][]byte // the payload pieces, as sent
}

func (g *gatherConn) SendGather(dgrams []transport.Gather, ep transport.Endpoint) error {
	joined := make([][]byte, len(dgrams))
	g.mu.Lock()
	for i := range dgrams {
		joined[i] = bytes.Join(dgrams[i][:], nil)
		if len(dgrams[i][1]) > 0 {
			g.inPlace++
			g.payloads = append(g.payloads, dgrams[i][1])
		} else {
			g.whole++
		}
	}
	g.mu.Unlock()
	return g.Conn.Send(joined, ep)
}

func newGatherSide(t *testing.T, net *transport.MemNetwork, addr string) (*side, *gatherConn) {
	t.Helper()
	return newGatherSideType(t, net, addr, qp.RC)
}

func newGatherSideType(t *testing.T, net *transport.MemNetwork, addr string, typ qp.Type) (*side, *gatherConn) {
	t.Helper()
	a := netip.MustParseAddr(addr)
	c, err := net.Listen(netip.AddrPortFrom(a, transport.RoCEv2Port))
	require.NoError(t, err)
	gc := &gatherConn{Conn: c}
	return sideOn(t, gc, a, typ, qp.Cap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 64}), gc
}

// TestPayloadSentInPlace: with a GatherSender, a packet whose payload lies
// in one SGE leaves from the registered memory itself, one that straddles
// two SGEs (and inline data) is copied; the bytes arrive exactly; every
// region reference is released once the packets are sent (the source's
// file mapping closes after deregistration).
func TestPayloadSentInPlace(t *testing.T) {
	mn := transport.NewMemNetwork()
	a, ga := newGatherSide(t, mn, "10.0.0.1")
	b, gb := newGatherSide(t, mn, "10.0.0.2")
	connect(t, a, b, qp.MTU1024, 14)

	m, err := mr.MapAnonymous(16 << 10)
	require.NoError(t, err)
	src := m.Bytes()
	for i := range src {
		src[i] = byte(i*7 + i>>8)
	}
	amr, err := a.e.Memory().RegMR(a.pd, src, mr.LocalWrite, mr.WithMapping(m))
	require.NoError(t, err)
	bmr, dst := regMR(t, b, 16<<10)

	// 1: one SGE of 4 KiB + 100 bytes: 5 packets, all in place.
	// 2: two SGEs of 1500 and 2000 bytes: packet 2 straddles them (copied),
	//    packets 1 and 4 lie in one SGE each; packet 3 (bytes 2048..3071)
	//    lies in the second SGE.
	// 3: inline data: copied.
	_, err = a.e.PostSend(a.q, []qp.SendWR{
		{ID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.Signaled, SGL: []qp.SGE{{Addr: amr.IOVA(), Length: 4196, LKey: amr.LKey()}},
			RemoteAddr: bmr.IOVA(), RKey: bmr.RKey()},
		{ID: 2, Opcode: qp.WRRDMAWrite, Flags: qp.Signaled, SGL: []qp.SGE{
			{Addr: amr.IOVA() + 5000, Length: 1500, LKey: amr.LKey()},
			{Addr: amr.IOVA() + 9000, Length: 2000, LKey: amr.LKey()}},
			RemoteAddr: bmr.IOVA() + 8192, RKey: bmr.RKey()},
		{ID: 3, Opcode: qp.WRRDMAWrite, Flags: qp.Signaled | qp.Inline, Inline: []byte("inline payload"),
			RemoteAddr: bmr.IOVA() + 12000, RKey: bmr.RKey()},
	})
	require.NoError(t, err)
	for id := uint64(1); id <= 3; id++ {
		wc := waitWC(t, a.scq)
		require.Equal(t, qp.WCSuccess, wc.Status, wc.Status.String())
		require.Equal(t, id, wc.ID)
	}
	require.Equal(t, src[:4196], dst[:4196])
	require.Equal(t, append(append([]byte(nil), src[5000:6500]...), src[9000:11000]...), dst[8192:8192+3500])
	require.Equal(t, []byte("inline payload"), dst[12000:12014])

	ga.mu.Lock()
	inPlace, payloads := ga.inPlace, ga.payloads
	ga.mu.Unlock()
	// WR 1: 5 packets; WR 2: 4 packets (1024, 1024 straddling, 1024, 428)
	// of which 3 in place; WR 3 copied.
	require.Equal(t, 5+3, inPlace)
	for _, p := range payloads {
		require.True(t, within(p, src), "an in-place payload aliases the source region")
	}

	// READ responses leave from the responder's region in place too:
	// 3000 bytes at MTU 1024 are 3 responses, all in place.
	for i := range 3000 {
		dst[i] = byte(i * 3)
	}
	_, err = a.e.PostSend(a.q, []qp.SendWR{{ID: 4, Opcode: qp.WRRDMARead, Flags: qp.Signaled,
		SGL: []qp.SGE{{Addr: amr.IOVA() + 12288, Length: 3000, LKey: amr.LKey()}}, RemoteAddr: bmr.IOVA(), RKey: bmr.RKey()}})
	require.NoError(t, err)
	wc := waitWC(t, a.scq)
	require.Equal(t, qp.WCSuccess, wc.Status, wc.Status.String())
	require.Equal(t, dst[:3000], src[12288:12288+3000])
	gb.mu.Lock()
	require.Equal(t, 3, gb.inPlace, "READ responses sent in place")
	for _, p := range gb.payloads {
		require.True(t, within(p, dst), "a READ response payload aliases the responder's region")
	}
	gb.mu.Unlock()

	require.NoError(t, amr.Dereg())
	require.NoError(t, m.Close(), "every region reference the sends took was released")
}

// within reports whether p lies inside buf's memory.
func within(p, buf []byte) bool {
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	at := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	return at >= lo && at+uintptr(len(p)) <= lo+uintptr(len(buf))
}

// TestPayloadCopiedForUCAndUD: UC and UD complete a WR once its packets
// are handed to the engine, possibly before the batch is sent, so their
// payloads are copied, never sent from the application's buffer.
func TestPayloadCopiedForUCAndUD(t *testing.T) {
	for _, typ := range []qp.Type{qp.UC, qp.UD} {
		t.Run(typ.String(), func(t *testing.T) {
			mn := transport.NewMemNetwork()
			a, ga := newGatherSideType(t, mn, "10.0.0.1", typ)
			b, _ := newGatherSideType(t, mn, "10.0.0.2", typ)
			amr, src := regMR(t, a, 4096)
			bmr, dst := regMR(t, b, 4096)
			for i := range src {
				src[i] = byte(i)
			}
			wr := qp.SendWR{ID: 1, Opcode: qp.WRSend, Flags: qp.Signaled,
				SGL: []qp.SGE{{Addr: amr.IOVA(), Length: 1000, LKey: amr.LKey()}}}
			if typ == qp.UD {
				udReady(t, a)
				udReady(t, b)
				wr.RemoteQPN, wr.RemoteQKey, wr.AV = b.q.Num(), 0x1234, qp.AddrVector{DGID: b.addr}
			} else {
				connect(t, a, b, qp.MTU1024, 14)
			}
			_, err := b.e.PostRecv(b.q, []qp.RecvWR{{ID: 9, SGL: []qp.SGE{{Addr: bmr.IOVA(), Length: 4096, LKey: bmr.LKey()}}}})
			require.NoError(t, err)
			_, err = a.e.PostSend(a.q, []qp.SendWR{wr})
			require.NoError(t, err)
			require.Equal(t, qp.WCSuccess, waitWC(t, a.scq).Status)
			require.Equal(t, qp.WCSuccess, waitWC(t, b.rcq).Status)
			off := 0
			if typ == qp.UD {
				off = 40 // the GRH a UD receive buffer starts with
			}
			require.Equal(t, src[:1000], dst[off:off+1000])
			ga.mu.Lock()
			defer ga.mu.Unlock()
			require.Zero(t, ga.inPlace, "%v payloads are copied", typ)
			require.Positive(t, ga.whole)
		})
	}
}

// udReady moves a UD QP to RTS with Q_Key 0x1234.
func udReady(t *testing.T, s *side) {
	t.Helper()
	require.NoError(t, s.e.ModifyQP(s.q, &qp.Attr{State: qp.Init, PortNum: 1, QKey: 0x1234},
		qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrQKey))
	require.NoError(t, s.e.ModifyQP(s.q, &qp.Attr{State: qp.RTR}, qp.AttrState))
	require.NoError(t, s.e.ModifyQP(s.q, &qp.Attr{State: qp.RTS, SQPSN: 1}, qp.AttrState|qp.AttrSQPSN))
}
