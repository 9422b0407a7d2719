package qp

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// The protocol logic is driven here without an engine: each QP's Env
// collects the packets it builds, the test decides which ones reach the
// peer (dropping, duplicating or reordering them by hand), and time is a
// plain variable, so every scenario is exact.

type capEnv struct {
	buf  [MaxPacketLen]byte
	pkts [][]byte
}

func (e *capEnv) TxBuffer() []byte { return e.buf[:] }
func (e *capEnv) Transmit(n int, _ *AddrVector) error {
	e.pkts = append(e.pkts, append([]byte(nil), e.buf[:n]...))
	return nil
}

// take returns and forgets the captured packets.
func (e *capEnv) take() [][]byte {
	p := e.pkts
	e.pkts = nil
	return p
}

type end struct {
	q        *QP
	env      *capEnv
	scq, rcq *CQ
	mem      *mr.Table
	pd       *mr.PD
	buf      []byte
	m        *mr.MR
	addr     netip.AddrPort
}

type link struct {
	t    *testing.T
	a, b *end
	now  time.Time
}

func newEnd(t *testing.T, typ Type, num uint32, addr string) *end {
	return newEndOver(t, typ, num, addr, make([]byte, 1<<20))
}

// newEndOver is newEnd with buf as the registered memory.
func newEndOver(t *testing.T, typ Type, num uint32, addr string, buf []byte) *end {
	mem := mr.NewTable(nil)
	pd, err := mem.AllocPD()
	require.NoError(t, err)
	scq, _ := NewCQ(256)
	rcq, _ := NewCQ(256)
	q, err := New(Config{Num: num, Type: typ, PD: pd, Mem: mem, SendCQ: scq, RecvCQ: rcq,
		Cap: Cap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 64}})
	require.NoError(t, err)
	m, err := mem.RegMR(pd, buf, mr.LocalWrite|mr.RemoteWrite|mr.RemoteRead|mr.RemoteAtomic)
	require.NoError(t, err)
	return &end{q: q, env: &capEnv{}, scq: scq, rcq: rcq, mem: mem, pd: pd, buf: buf, m: m,
		addr: netip.AddrPortFrom(netip.MustParseAddr(addr), 4791)}
}

// newLink connects two QPs (RTS, PSN 0xFFFFFE so the wrap is crossed)
// with path MTU 256, timeout 10 and the given retry counts.
func newLink(t *testing.T, typ Type, retry, rnr uint8) *link {
	return connectLink(t, typ, retry, rnr, newEnd(t, typ, 0x11, "10.0.0.1"), newEnd(t, typ, 0x12, "10.0.0.2"))
}

// connectLink is newLink over the ends a and b.
func connectLink(t *testing.T, typ Type, retry, rnr uint8, a, b *end) *link {
	l := &link{t: t, a: a, b: b, now: time.Unix(1000, 0)}
	for _, p := range [][2]*end{{l.a, l.b}, {l.b, l.a}} {
		x, y := p[0], p[1]
		require.NoError(t, x.q.Modify(&Attr{State: Init, PortNum: 1, QKey: 0x1234,
			AccessFlags: AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic},
			l.initMask(typ), l.now))
		rtr := AttrState
		if typ.Connected() {
			rtr |= AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN
		}
		if typ == RC {
			rtr |= AttrMaxDestRdAtomic | AttrMinRNRTimer
		}
		require.NoError(t, x.q.Modify(&Attr{State: RTR, AV: AddrVector{DGID: y.addr.Addr()}, PathMTU: MTU256,
			DestQPN: y.q.Num(), RQPSN: 0xFFFFFE, MaxDestRdAtomic: 4, MinRNRTimer: 3}, rtr, l.now))
		rts := AttrState | AttrSQPSN
		if typ == RC {
			rts |= AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic
		}
		require.NoError(t, x.q.Modify(&Attr{State: RTS, SQPSN: 0xFFFFFE, Timeout: 10, RetryCnt: retry,
			RNRRetry: rnr, MaxRdAtomic: 4}, rts, l.now))
	}
	return l
}

func (l *link) initMask(typ Type) AttrMask {
	if typ.Datagram() {
		return AttrState | AttrPKeyIndex | AttrPort | AttrQKey
	}
	return AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags
}

// deliver hands packets to dst as the engine would (after the checks).
func (l *link) deliver(dst, src *end, pkts ...[]byte) {
	for _, raw := range pkts {
		var p wire.Packet
		require.NoError(l.t, p.Parse(raw))
		ri := RecvInfo{Src: src.addr, Dst: dst.addr}
		require.Equal(l.t, DropNone, dst.q.Check(&p, &ri, dst.addr.Addr()))
		dst.q.Receive(dst.env, &p, &ri, l.now)
		dst.q.Run(dst.env, l.now, 1000)
	}
}

func opcodes(pkts [][]byte) []wire.Opcode {
	var out []wire.Opcode
	for _, p := range pkts {
		out = append(out, wire.BTH(p).Opcode())
	}
	return out
}

func psns(pkts [][]byte) []PSN {
	var out []PSN
	for _, p := range pkts {
		out = append(out, PSN(wire.BTH(p).PSN()))
	}
	return out
}

func (e *end) sge(off, n int) SGE {
	return SGE{Addr: e.m.IOVA() + uint64(off), Length: uint32(n), LKey: e.m.LKey()}
}

func (l *link) post(wrs ...SendWR) {
	for i := range wrs {
		require.NoError(l.t, l.a.q.PostSend(&wrs[i]))
	}
	l.a.q.Run(l.a.env, l.now, 1000)
}

func poll(t *testing.T, cq *CQ) []WC {
	wcs := make([]WC, 64)
	n := cq.Poll(wcs)
	return wcs[:n]
}

func TestSegmentationAckReqAndPSNWrap(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	fill := func(b []byte) {
		for i := range b {
			b[i] = byte(i * 7)
		}
	}
	fill(l.a.buf[:1000])
	l.post(SendWR{ID: 1, Opcode: WRRDMAWriteWithImm, Flags: Signaled, Imm: 9, SGL: []SGE{l.a.sge(0, 601)},
		RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()})
	req := l.a.env.take()
	require.Equal(t, []wire.Opcode{wire.RCWriteFirst, wire.RCWriteMiddle, wire.RCWriteLastImm}, opcodes(req))
	require.Equal(t, []PSN{0xFFFFFE, 0xFFFFFF, 0}, psns(req))
	for i, p := range req {
		require.Equal(t, i == 2, wire.BTH(p).AckReq(), "AckReq only on the last packet")
	}
	var p wire.Packet
	require.NoError(t, p.Parse(req[2]))
	require.Equal(t, 3, p.PadCount) // 601 = 256+256+89: the last 89 bytes get 3 pad bytes
	require.Len(t, p.Payload, 89)
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 50}))
	l.deliver(l.b, l.a, req...)
	acks := l.b.env.take()
	require.Len(t, acks, 1, "one ACK per message")
	require.Equal(t, wire.RCAck, wire.BTH(acks[0]).Opcode())
	require.Equal(t, PSN(0), PSN(wire.BTH(acks[0]).PSN()))
	require.Equal(t, uint64(2), l.b.q.ctr.AckDeferred.Load())
	l.deliver(l.a, l.b, acks...)
	wc := poll(t, l.a.scq)
	require.Len(t, wc, 1)
	require.Equal(t, WCSuccess, wc[0].Status)
	require.Equal(t, WCRDMAWrite, wc[0].Opcode)
	rwc := poll(t, l.b.rcq)
	require.Len(t, rwc, 1)
	require.Equal(t, WCRecvRDMAWithImm, rwc[0].Opcode)
	require.Equal(t, uint32(601), rwc[0].ByteLen)
	require.Equal(t, l.a.buf[:601], l.b.buf[:601])
	require.True(t, l.a.q.Deadline().IsZero(), "timer stops when nothing is outstanding")
}

func TestResponderDuplicateAndOutOfSequence(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	l.post(SendWR{ID: 1, Opcode: WRRDMAWrite, SGL: []SGE{l.a.sge(0, 1000)}, RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()})
	req := l.a.env.take()
	require.Len(t, req, 4)
	// Lose packet 1: packets 2 and 3 are out of sequence; one NAK only.
	l.deliver(l.b, l.a, req[0], req[2], req[3])
	naks := l.b.env.take()
	require.Len(t, naks, 1)
	var p wire.Packet
	require.NoError(t, p.Parse(naks[0]))
	require.Equal(t, wire.SynNAK, p.AETH.Syndrome().Kind())
	require.Equal(t, uint8(wire.NAKPSNSeqErr), p.AETH.Syndrome().NAKCode())
	require.Equal(t, PSN(wire.BTH(req[1]).PSN()), PSN(p.BTH.PSN()), "the NAK names the expected PSN")
	require.Equal(t, uint64(1), l.b.q.ctr.OutOfSeqRequest.Load())
	// The requester goes back to the NAKed PSN and resends from there.
	l.deliver(l.a, l.b, naks...)
	again := l.a.env.take()
	require.Equal(t, psns(req[1:]), psns(again))
	require.Equal(t, []wire.Opcode{wire.RCWriteMiddle, wire.RCWriteMiddle, wire.RCWriteLast}, opcodes(again))
	l.deliver(l.b, l.a, again...)
	ack := l.b.env.take()
	require.Len(t, ack, 1)
	// A duplicate of the whole message is ACKed again, not re-executed.
	l.b.buf[0] ^= 0xFF
	l.deliver(l.b, l.a, req[0])
	dup := l.b.env.take()
	require.Len(t, dup, 1)
	require.NoError(t, p.Parse(dup[0]))
	require.Equal(t, wire.SynACK, p.AETH.Syndrome().Kind())
	require.Equal(t, PSN(wire.BTH(req[3]).PSN()), PSN(p.BTH.PSN()))
	require.Equal(t, l.a.buf[0]^0xFF, l.b.buf[0], "duplicate data is not placed again")
	require.Equal(t, uint64(1), l.b.q.ctr.DuplicateRequest.Load())
	l.deliver(l.a, l.b, ack...)
	require.Len(t, poll(t, l.a.scq), 0) // unsignalled
	require.Equal(t, 0, l.a.q.SendQueueLen())
}

func TestRetransmitTimeoutAndRetryExhaustion(t *testing.T) {
	l := newLink(t, RC, 2, 7)
	l.post(SendWR{ID: 7, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 10)}})
	first := l.a.env.take()
	require.Len(t, first, 1)
	// IBA's local ACK timer (retransmitAt); the requester's own earlier
	// fast retransmits (recovery.go) resend too but spend no retry_cnt.
	d := l.a.q.retransmitAt
	require.Equal(t, RetransmitTimeout(10), d.Sub(l.now), "4.096us * 2^10")
	for i := 0; i < 2; i++ {
		l.now = d
		l.a.q.OnTimer(l.a.env, l.now, 1000)
		again := l.a.env.take()
		require.Equal(t, psns(first), psns(again), "retry %d resends the same PSN", i+1)
		d = l.a.q.retransmitAt
	}
	l.now = d
	l.a.q.OnTimer(l.a.env, l.now, 1000)
	wc := poll(t, l.a.scq)
	require.Len(t, wc, 1)
	require.Equal(t, WCRetryExcErr, wc[0].Status)
	require.Equal(t, Err, l.a.q.State())
	require.Equal(t, uint64(2), l.a.q.ctr.CompleterRetryErr.Load())
	require.Equal(t, uint64(1), l.a.q.ctr.RetryExceededErr.Load())
}

func TestRNRNakTimerAndRecovery(t *testing.T) {
	l := newLink(t, RC, 7, 2)
	l.post(SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 100)}})
	req := l.a.env.take()
	l.deliver(l.b, l.a, req...)
	rnr := l.b.env.take()
	require.Len(t, rnr, 1)
	var p wire.Packet
	require.NoError(t, p.Parse(rnr[0]))
	require.Equal(t, wire.SynRNR, p.AETH.Syndrome().Kind())
	require.Equal(t, uint8(3), p.AETH.Syndrome().RNRTimer(), "min_rnr_timer")
	l.deliver(l.a, l.b, rnr...)
	require.Empty(t, l.a.env.take(), "nothing is resent before the RNR timer")
	require.Equal(t, RNRDelay(3), l.a.q.Deadline().Sub(l.now))
	require.Equal(t, 30*time.Microsecond, RNRDelay(3))
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 9, SGL: []SGE{l.b.sge(0, 128)}}))
	l.now = l.a.q.Deadline()
	l.a.q.OnTimer(l.a.env, l.now, 1000)
	again := l.a.env.take()
	require.Equal(t, psns(req), psns(again))
	l.deliver(l.b, l.a, again...)
	l.deliver(l.a, l.b, l.b.env.take()...)
	require.Equal(t, WCSuccess, poll(t, l.a.scq)[0].Status)
	require.Equal(t, uint32(100), poll(t, l.b.rcq)[0].ByteLen)
	require.Equal(t, uint64(1), l.a.q.ctr.RcvdRNRErr.Load())
	require.Equal(t, uint64(1), l.b.q.ctr.SendRNRErr.Load())
}

func TestReadResumeAndImpliedNak(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	for i := range l.b.buf[:1000] {
		l.b.buf[i] = byte(i)
	}
	l.post(
		SendWR{ID: 1, Opcode: WRRDMARead, Flags: Signaled, SGL: []SGE{l.a.sge(0, 1000)}, RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()},
		SendWR{ID: 2, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(2000, 10)}},
	)
	req := l.a.env.take()
	require.Equal(t, []wire.Opcode{wire.RCReadRequest, wire.RCSendOnly}, opcodes(req))
	require.Equal(t, PSN(wire.BTH(req[0]).PSN()).Add(4), PSN(wire.BTH(req[1]).PSN()), "a READ of 4 MTUs takes 4 PSNs")
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 5, SGL: []SGE{l.b.sge(4096, 64)}}))
	l.deliver(l.b, l.a, req...)
	resp := l.b.env.take()
	require.Equal(t, []wire.Opcode{wire.RCReadResponseFirst, wire.RCReadResponseMiddle, wire.RCReadResponseMiddle,
		wire.RCReadResponseLast, wire.RCAck}, opcodes(resp))
	// The third READ response is lost; the ACK of the SEND behind it is an
	// implied NAK: the requester asks again for the rest of the READ only.
	l.deliver(l.a, l.b, resp[0], resp[1], resp[3], resp[4])
	require.Equal(t, uint64(1), l.a.q.ctr.ImpliedNAKs.Load())
	retry := l.a.env.take()
	require.Equal(t, wire.RCReadRequest, wire.BTH(retry[0]).Opcode())
	var p wire.Packet
	require.NoError(t, p.Parse(retry[0]))
	require.Equal(t, l.b.m.IOVA()+512, p.RETH.VA(), "resumed at the first missing byte")
	require.Equal(t, uint32(488), p.RETH.DMALen())
	require.Equal(t, PSN(wire.BTH(resp[2]).PSN()), PSN(p.BTH.PSN()))
	require.Len(t, retry, 1, "the SEND behind the READ waits for it (readHold, readkeep.go)")
	// The responder replays from its saved READ; once the READ is whole
	// the SEND goes again, a duplicate the responder only acknowledges.
	l.deliver(l.b, l.a, retry...)
	replay := l.b.env.take()
	require.Equal(t, []wire.Opcode{wire.RCReadResponseMiddle, wire.RCReadResponseLast}, opcodes(replay))
	l.deliver(l.a, l.b, replay...)
	resend := l.a.env.take()
	require.Equal(t, []wire.Opcode{wire.RCSendOnly}, opcodes(resend))
	require.Equal(t, req[1], resend[0], "the same packet, PSN included")
	l.deliver(l.b, l.a, resend...)
	l.deliver(l.a, l.b, l.b.env.take()...)
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, 2)
	require.Equal(t, uint64(1), wcs[0].ID)
	require.Equal(t, WCRDMARead, wcs[0].Opcode)
	require.Equal(t, uint64(2), wcs[1].ID)
	require.Equal(t, l.b.buf[:1000], l.a.buf[:1000])
	require.Len(t, poll(t, l.b.rcq), 1, "the SEND was received once")
}

func TestAtomicExecutedOnceAndReplayed(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	binary.NativeEndian.PutUint64(l.b.buf[64:], 10)
	l.post(SendWR{ID: 1, Opcode: WRAtomicFetchAndAdd, Flags: Signaled, CompareAdd: 5, SGL: []SGE{l.a.sge(0, 8)},
		RemoteAddr: l.b.m.IOVA() + 64, RKey: l.b.m.RKey()})
	req := l.a.env.take()
	l.deliver(l.b, l.a, req...)
	ack1 := l.b.env.take()
	require.Equal(t, uint64(15), binary.NativeEndian.Uint64(l.b.buf[64:]))
	// The ACK is lost; the requester times out and resends; the responder
	// answers from the saved result without adding again.
	l.now = l.a.q.Deadline()
	l.a.q.OnTimer(l.a.env, l.now, 1000)
	l.deliver(l.b, l.a, l.a.env.take()...)
	ack2 := l.b.env.take()
	require.Equal(t, uint64(15), binary.NativeEndian.Uint64(l.b.buf[64:]))
	require.True(t, bytes.Equal(ack1[0][:len(ack1[0])-4], ack2[0][:len(ack2[0])-4]), "the replayed ATOMIC ACK is identical")
	l.deliver(l.a, l.b, ack2...)
	wc := poll(t, l.a.scq)
	require.Len(t, wc, 1)
	require.Equal(t, WCFetchAdd, wc[0].Opcode)
	require.Equal(t, uint64(10), binary.NativeEndian.Uint64(l.a.buf[:8]))
	require.Equal(t, uint64(1), l.b.q.ctr.ResponderResourceHit.Load())
}

func TestRemoteAccessNakMovesBothToErr(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	l.post(SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 600)},
		RemoteAddr: l.b.m.IOVA() + uint64(len(l.b.buf)) - 100, RKey: l.b.m.RKey()},
		SendWR{ID: 2, Opcode: WRSend, SGL: []SGE{l.a.sge(0, 8)}})
	before := append([]byte(nil), l.b.buf...)
	l.deliver(l.b, l.a, l.a.env.take()[0])
	nak := l.b.env.take()
	require.Len(t, nak, 1)
	require.Equal(t, Err, l.b.q.State())
	require.Equal(t, before, l.b.buf, "nothing placed")
	l.deliver(l.a, l.b, nak...)
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, 2)
	require.Equal(t, WCRemAccessErr, wcs[0].Status)
	require.Equal(t, WCWRFlushErr, wcs[1].Status)
	require.Equal(t, Err, l.a.q.State())
}

func TestUCDropsMessageWithGap(t *testing.T) {
	l := newLink(t, UC, 0, 0)
	for i := 0; i < 2; i++ {
		require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: uint64(10 + i), SGL: []SGE{l.b.sge(4096*i, 4096)}}))
	}
	l.post(SendWR{ID: 1, Opcode: WRSend, SGL: []SGE{l.a.sge(0, 700)}},
		SendWR{ID: 2, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 300)}})
	pk := l.a.env.take()
	require.Equal(t, []wire.Opcode{wire.UCSendFirst, wire.UCSendMiddle, wire.UCSendLast, wire.UCSendFirst, wire.UCSendLast}, opcodes(pk))
	for _, x := range pk {
		require.False(t, wire.BTH(x).AckReq(), "rxe sends UC without AckReq")
	}
	require.Len(t, poll(t, l.a.scq), 1, "UC completes on send")
	// The middle packet of message 1 is lost: message 1 is dropped whole,
	// message 2 arrives in the receive WR message 1 would have used.
	l.deliver(l.b, l.a, pk[0], pk[2], pk[3], pk[4])
	require.Empty(t, l.b.env.take(), "UC never ACKs")
	rwc := poll(t, l.b.rcq)
	require.Len(t, rwc, 1)
	require.Equal(t, uint64(10), rwc[0].ID)
	require.Equal(t, uint32(300), rwc[0].ByteLen)
}

func TestUDSendCarriesDETHAndGRH(t *testing.T) {
	l := newLink(t, UD, 0, 0)
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 3, SGL: []SGE{l.b.sge(0, 40+256)}}))
	l.post(SendWR{ID: 1, Opcode: WRSendWithImm, Flags: Signaled, Imm: 0xABCD, SGL: []SGE{l.a.sge(0, 200)},
		AV: AddrVector{DGID: l.b.addr.Addr()}, RemoteQPN: l.b.q.Num(), RemoteQKey: 0x80000000})
	pk := l.a.env.take()
	require.Equal(t, []wire.Opcode{wire.UDSendOnlyImm}, opcodes(pk))
	require.False(t, wire.BTH(pk[0]).AckReq(), "rxe sends UD without AckReq")
	var p wire.Packet
	require.NoError(t, p.Parse(pk[0]))
	require.Equal(t, uint32(0x1234), p.DETH.QKey(), "high bit: the QP's own Q_Key")
	require.Equal(t, l.a.q.Num(), p.DETH.SrcQP())
	// A wrong Q_Key is refused by Check, without touching the QP.
	bad := append([]byte(nil), pk[0]...)
	wire.DETH(bad[wire.BTHLen:]).SetQKey(7)
	require.NoError(t, p.Parse(bad))
	ri := RecvInfo{Src: l.a.addr, Dst: l.b.addr}
	require.Equal(t, DropQKey, l.b.q.Check(&p, &ri, netip.Addr{}))
	l.deliver(l.b, l.a, pk...)
	rwc := poll(t, l.b.rcq)
	require.Len(t, rwc, 1)
	require.Equal(t, uint32(240), rwc[0].ByteLen)
	require.Equal(t, l.a.q.Num(), rwc[0].SrcQP)
	require.Equal(t, WCWithGRH|WCWithImm, rwc[0].Flags)
	require.Equal(t, byte(0x45), l.b.buf[20])
}

func TestCheckOrderAndNoStateChange(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	l.post(SendWR{ID: 1, Opcode: WRSend, SGL: []SGE{l.a.sge(0, 8)}})
	pk := l.a.env.take()[0]
	var p wire.Packet
	require.NoError(t, p.Parse(pk))
	ri := RecvInfo{Src: l.a.addr, Dst: l.b.addr}
	other := RecvInfo{Src: netip.MustParseAddrPort("10.9.9.9:4791"), Dst: l.b.addr}
	require.Equal(t, DropAddress, l.b.q.Check(&p, &other, l.b.addr.Addr()))
	badKey := append([]byte(nil), pk...)
	wire.BTH(badKey).SetPKey(0x1234)
	require.NoError(t, p.Parse(badKey))
	require.Equal(t, DropPKey, l.b.q.Check(&p, &ri, l.b.addr.Addr()))
	// Address is checked before the P_Key, as in rxe.
	require.Equal(t, DropAddress, l.b.q.Check(&p, &other, l.b.addr.Addr()))
	uc := append([]byte(nil), pk...)
	wire.BTH(uc).SetOpcode(wire.UCSendOnly)
	require.NoError(t, p.Parse(uc))
	require.Equal(t, DropType, l.b.q.Check(&p, &ri, l.b.addr.Addr()))
	require.NoError(t, l.b.q.Modify(&Attr{State: Err}, AttrState, l.now))
	require.NoError(t, p.Parse(pk))
	require.Equal(t, DropState, l.b.q.Check(&p, &ri, l.b.addr.Addr()))
}

// ringEnv is a capEnv that reuses its packet buffers, for allocation
// counting.
type ringEnv struct {
	bufs [16][MaxPacketLen]byte
	lens [16]int
	n    int
}

func (e *ringEnv) TxBuffer() []byte { return e.bufs[e.n%16][:] }
func (e *ringEnv) Transmit(n int, _ *AddrVector) error {
	e.lens[e.n%16] = n
	e.n++
	return nil
}

// TestDataPathDoesNotAllocate: posting a multi-packet WRITE and a SEND,
// segmenting, placing, acknowledging and completing them allocates
// nothing in steady state.
func TestDataPathDoesNotAllocate(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	ea, eb := &ringEnv{}, &ringEnv{}
	var p wire.Packet
	ria := RecvInfo{Src: l.b.addr, Dst: l.a.addr}
	rib := RecvInfo{Src: l.a.addr, Dst: l.b.addr}
	wrs := []SendWR{
		{ID: 1, Opcode: WRRDMAWrite, SGL: []SGE{l.a.sge(0, 1000)}, RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()},
		{ID: 2, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 300)}},
	}
	recv := RecvWR{ID: 3, SGL: []SGE{l.b.sge(8192, 512)}}
	wcs := make([]WC, 4)
	round := func() {
		if err := l.b.q.PostRecv(&recv); err != nil {
			t.Fatal(err)
		}
		for i := range wrs {
			if err := l.a.q.PostSend(&wrs[i]); err != nil {
				t.Fatal(err)
			}
		}
		ea.n, eb.n = 0, 0
		l.a.q.Run(ea, l.now, 100)
		for i := 0; i < ea.n; i++ {
			if err := p.Parse(ea.bufs[i][:ea.lens[i]]); err != nil {
				t.Fatal(err)
			}
			l.b.q.Receive(eb, &p, &rib, l.now)
		}
		for i := 0; i < eb.n; i++ {
			if err := p.Parse(eb.bufs[i][:eb.lens[i]]); err != nil {
				t.Fatal(err)
			}
			l.a.q.Receive(ea, &p, &ria, l.now)
		}
		if l.a.scq.Poll(wcs) != 1 || l.b.rcq.Poll(wcs) != 1 {
			t.Fatal("missing completion")
		}
	}
	round()
	require.Zero(t, testing.AllocsPerRun(200, round))
	require.Equal(t, 0, l.a.q.SendQueueLen())
}
