package qp

import (
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// deliverRun is link.deliver with the receiver's Run given budget
// packets after each packet, as an engine with little budget left does.
func (l *link) deliverRun(budget int, dst, src *end, pkts ...[]byte) {
	for _, raw := range pkts {
		var p wire.Packet
		require.NoError(l.t, p.Parse(raw))
		ri := RecvInfo{Src: src.addr, Dst: dst.addr}
		require.Equal(l.t, DropNone, dst.q.Check(&p, &ri, dst.addr.Addr()))
		dst.q.Receive(dst.env, &p, &ri, l.now)
		dst.q.Run(dst.env, l.now, budget)
	}
}

// Bug (found by the protocol audit, session AF): a READ hold that began
// while the requester was in the middle of the WRITE after the READ (an
// implied NAK arriving after a go-back-N had already resent the WRITE's
// first packet) ended, when the READ completed, by setting the request
// PSN back to the completer's PSN without rewinding the WRITE: its next
// packet went out as WRITE_MIDDLE with the PSN of its WRITE_FIRST, and
// every later packet one PSN early. The responder (rxe's too) took the
// shifted WRITE_LAST as the last packet in sequence and placed its bytes
// one MTU too low: the WRITE completed successfully with the last MTU of
// the target never written (found by a mixed-operation lossy simulation
// with 2% reordering and no loss).
func TestReadHoldEndKeepsPartlySentWritePSNs(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	for i := range l.b.buf[:1000] {
		l.b.buf[i] = byte(i * 7)
	}
	for i := range l.a.buf[8192 : 8192+1024] {
		l.a.buf[8192+i] = byte(i*13 + 1)
	}
	l.post(
		SendWR{ID: 1, Opcode: WRRDMARead, Flags: Signaled, SGL: []SGE{l.a.sge(0, 1000)},
			RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()},
		SendWR{ID: 2, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(8192, 1024)},
			RemoteAddr: l.b.m.IOVA() + 65536, RKey: l.b.m.RKey()},
	)
	req := l.a.env.take()
	require.Equal(t, []wire.Opcode{wire.RCReadRequest, wire.RCWriteFirst, wire.RCWriteMiddle,
		wire.RCWriteMiddle, wire.RCWriteLast}, opcodes(req))
	// Reordered on the way: the second WRITE_MIDDLE overtakes the READ
	// (sequence NAK for the READ's PSN), then the WRITE_LAST overtakes it
	// again (sequence NAK for its PSN).
	l.deliver(l.b, l.a, req[3], req[0], req[1], req[2], req[4])
	resp := l.b.env.take()
	require.Equal(t, []wire.Opcode{wire.RCAck, wire.RCReadResponseFirst, wire.RCReadResponseMiddle,
		wire.RCReadResponseMiddle, wire.RCReadResponseLast, wire.RCAck}, opcodes(resp))
	// The first NAK: go-back-N to the READ; the engine's budget lets the
	// READ and the WRITE's first packet out.
	l.deliverRun(2, l.a, l.b, resp[0])
	again := l.a.env.take()
	require.Equal(t, []wire.Opcode{wire.RCReadRequest, wire.RCWriteFirst}, opcodes(again))
	// The second NAK overtakes the READ's responses: an implied NAK for
	// the READ, which holds the WQEs after it; then the reply arrives
	// whole and the READ completes.
	l.deliverRun(2, l.a, l.b, resp[5], resp[1], resp[2], resp[3], resp[4])
	more := append(again, l.a.env.take()...)
	for i := 2; i < len(more); i++ {
		require.Equal(t, PSN(wire.BTH(more[i-1]).PSN()).Next(), PSN(wire.BTH(more[i]).PSN()),
			"packet %d (%v) continues the WRITE's PSNs", i, wire.BTH(more[i]).Opcode())
	}
	// Everything reaches the responder; the WRITE's bytes must all be in
	// place when it completes.
	for range 20 {
		l.deliver(l.b, l.a, more...)
		l.deliver(l.a, l.b, l.b.env.take()...)
		if more = l.a.env.take(); len(more) == 0 {
			if l.a.q.Deadline().IsZero() {
				break
			}
			l.now = l.a.q.Deadline()
			l.a.q.OnTimer(l.a.env, l.now, 1000)
			more = l.a.env.take()
		}
	}
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, 2)
	for _, wc := range wcs {
		require.Equal(t, WCSuccess, wc.Status)
	}
	require.Equal(t, l.b.buf[:1000], l.a.buf[:1000], "READ data")
	require.Equal(t, l.a.buf[8192:8192+1024], l.b.buf[65536:65536+1024], "WRITE data")
}
