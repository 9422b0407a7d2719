package qp

import (
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/wire"
)

// FuzzRTSQP drives two connected QPs in RTS through the deterministic
// harness of protocol_test.go (no engine, no sockets, time a variable)
// with a program the fuzzer writes: posted sends and receives, the
// packets the QPs built delivered to the peer with losses, duplicates and
// reordering, packets crafted from the input (any opcode, a PSN near the
// expected one, AckReq/SE, RETH, AETH, atomic and DETH fields, payloads
// up to two MTUs) or taken raw from it, timer expiries and modifies. After
// every step it checks what IBA promises whatever the peer sends:
//
//   - nothing panics, and a packet a QP builds always parses;
//   - every completion is for a WR that was posted on that queue, and the
//     completions of a queue come in posting order (strictly increasing
//     IDs), so each WR completes at most once and a CQ never holds more
//     than was posted;
//   - a QP leaves RTS (or SQD, SQE) on its own only for ERR, or for SQE on
//     UC and UD (IBA 10.3.1): no packet takes it back to an earlier state;
//   - once in ERR, a Run flushes every outstanding WR (IBA 10.3.1: a QP in
//     ERR completes its queues with WR_FLUSH_ERR);
//   - no byte outside the registered regions changes: each region sits
//     between guard pages of a known pattern;
//   - on RC the PSNs move as IBA 9.7 has them: the responder's expected
//     PSN and the completer's oldest unacknowledged PSN never go back, and
//     the latter never passes the requester's next PSN (nothing is
//     acknowledged that was not sent, whatever ACK PSN a peer makes up).
func FuzzRTSQP(f *testing.F) {
	for _, s := range fuzzRTSSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		runRTSProgram(t, in)
	})
}

// The first input byte picks the QP type and the retry counts, the
// second the budget of the Run after each delivered packet (0: 1000, as
// the engine; a small one leaves READ replies paced across steps, with
// requests held behind them); then each step is an op byte (side in bit 7, kind in bits 0-2, a parameter in
// bits 3-6) followed by the bytes that kind reads. Bytes past the end
// read as zero.
const (
	rtsPostSend = iota
	rtsPostRecv
	rtsDeliver
	rtsCrafted
	rtsRaw
	rtsTime
	rtsRun
	rtsModify
)

// rtsMaxSteps bounds the work one input causes.
const rtsMaxSteps = 256

// fuzzMRLen is each end's registered region; fuzzGuard the guard bytes
// on either side of it.
const (
	fuzzMRLen = 8 << 10
	fuzzGuard = 4 << 10
)

// The seeds, written with the step builders below: each starts a
// scenario the fuzzer then varies.
var fuzzRTSSeeds = [][]byte{
	// RC: a two-packet SEND delivered whole and ACKed.
	rtsSeed(rtsRC, 0, stepRecv(sideB, 0, 0, 1024), stepSend(sideA, 0, 1, 400, 0, 0),
		stepDeliver(sideA, 0, 0), stepDeliver(sideB, 0, 0)),
	// RC: two WRITEs, the first ACK lost: the second ACK completes both.
	rtsSeed(rtsRC, 0, stepSend(sideA, 2, 1, 300, 0, 0), stepSend(sideA, 2, 1, 300, 1024, 1024),
		stepDeliver(sideA, 0, 0), stepDeliver(sideB, 0, 1)),
	// RC: a WRITE whose second packet is lost: sequence NAK, go-back-N.
	rtsSeed(rtsRC, 0, stepSend(sideA, 2, 1, 1000, 0, 0), stepDeliver(sideA, 0, 2), stepDeliver(sideB, 0, 0),
		stepDeliver(sideA, 0, 0), stepDeliver(sideB, 0, 0)),
	// RC: a READ whose responses arrive reversed, then the timer.
	rtsSeed(rtsRC, 0, stepSend(sideA, 4, 1, 1000, 0, 0), stepDeliver(sideA, 0, 0), stepDeliver(sideB, 1, 0),
		stepTime(1, 0), stepDeliver(sideA, 0, 0), stepDeliver(sideB, 0, 0)),
	// RC: a FETCH_ADD answered by a crafted atomic ACK, then a stray
	// READ response and a NAK.
	rtsSeed(rtsRC, 0, stepSend(sideA, 5, 1, 8, 64, 64),
		stepCrafted(sideA, craft{op: 18, syn: 0x00, orig: 42}),
		stepCrafted(sideA, craft{op: 14, plen: 100}),
		stepCrafted(sideA, craft{op: 17, syn: 0x61})),
	// RC: crafted requests into the responder: a long READ (paced
	// reply), a WRITE, an atomic, a SEND with invalidate.
	rtsSeed(rtsRC, 4, stepRecv(sideB, 0, 0, 1024),
		stepCrafted(sideB, craft{op: 12, flags: 1, dmaLen: 4000}),
		stepCrafted(sideB, craft{op: 10, flags: 1, delta: 16, dmaLen: 200, plen: 200}),
		stepCrafted(sideB, craft{op: 20, flags: 9, delta: 17, vaOff: 64}),
		stepCrafted(sideB, craft{op: 22, flags: 33, delta: 18, plen: 10}),
		stepRun(sideB, 3), stepDeliver(sideB, 0, 0)),
	// RC: no receive posted: RNR NAK, the RNR timer, then a receive.
	rtsSeed(rtsRC, 0, stepSend(sideA, 0, 1, 100, 0, 0), stepDeliver(sideA, 0, 0), stepDeliver(sideB, 0, 0),
		stepRecv(sideB, 0, 0, 1024), stepTime(1, 0), stepDeliver(sideA, 0, 0), stepDeliver(sideB, 0, 0)),
	// RC: retry_cnt 1 runs out against a silent peer.
	rtsSeed(rtsRC&^0x1C|1<<2, 0, stepSend(sideA, 2, 1, 100, 0, 0), stepTime(1, 0), stepTime(1, 0), stepTime(1, 0)),
	// RC: drain (SQD) with a WRITE in flight, then resume.
	rtsSeed(rtsRC, 0, stepSend(sideA, 2, 1, 600, 0, 0), stepModify(sideA, 1), stepSend(sideA, 0, 1, 10, 0, 0),
		stepDeliver(sideA, 0, 0), stepDeliver(sideB, 0, 0), stepModify(sideA, 2), stepRun(sideA, 8)),
	// RC: a bad lkey fails the WR locally and the QP moves to ERR.
	rtsSeed(rtsRC, 0, stepSend(sideA, 0, 1|8, 100, 0, 0), stepSend(sideA, 0, 1, 100, 0, 0)),
	// UC: a SEND with its middle packet lost.
	rtsSeed(rtsUC, 0, stepRecv(sideB, 0, 0, 1024), stepSend(sideA, 0, 1, 700, 0, 0), stepDeliver(sideA, 0, 2)),
	// UD: a SEND to the peer, and a raw datagram.
	rtsSeed(rtsUD, 0, stepRecv(sideB, 0, 0, 1024), stepSend(sideA, 1, 1, 200, 0, 0), stepDeliver(sideA, 0, 0),
		stepRaw(sideB, []byte{0x64, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x12, 0x00, 0x00, 0x00, 0x00,
			0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x00, 0x11})),
}

// Seed configurations (the first byte): the QP type, retry_cnt 7 and
// rnr_retry 7.
const (
	rtsRC = 0 | 7<<2 | 7<<5
	rtsUC = 1 | 7<<2 | 7<<5
	rtsUD = 2 | 7<<2 | 7<<5
)

// The side bit of an op byte: the step acts on (or delivers from) a or b.
const (
	sideA = 0
	sideB = 0x80
)

func rtsSeed(cfg, budget byte, steps ...[]byte) []byte {
	out := []byte{cfg, budget}
	for _, s := range steps {
		out = append(out, s...)
	}
	return out
}

func be16(v uint16) []byte { return []byte{byte(v >> 8), byte(v)} }

// stepSend posts the send opcode sendOps[typ][op]; flags as postSend
// reads them (1 signalled, 8 bad lkey, 16 bad rkey, ...).
func stepSend(side, op, flags byte, n, off, roff uint16) []byte {
	s := []byte{side | op<<3 | rtsPostSend, flags}
	return append(append(append(s, be16(n)...), be16(off)...), be16(roff)...)
}

func stepRecv(side, param byte, off, n uint16) []byte {
	return append(append([]byte{side | param<<3 | rtsPostRecv}, be16(off)...), be16(n)...)
}

// stepDeliver delivers the packets side built to the other side, but
// those in mask; param 1 reverses them, 2 duplicates, 4 keeps them.
func stepDeliver(side, param, mask byte) []byte {
	return []byte{side | param<<3 | rtsDeliver, mask}
}

// craft is a crafted packet as crafted reads it; op indexes craftOps.
type craft struct {
	op, flags           byte
	delta               int8
	vaOff               int16
	dmaLen              uint16
	syn, msn, swap, cmp byte
	orig                byte
	plen                uint16
}

func stepCrafted(side byte, c craft) []byte {
	s := []byte{side | rtsCrafted, c.op, c.flags, byte(c.delta)}
	s = append(append(s, be16(uint16(c.vaOff))...), be16(c.dmaLen)...)
	s = append(s, c.syn, c.msn, c.swap, c.cmp, c.orig)
	return append(s, be16(c.plen)...)
}

func stepRaw(side byte, raw []byte) []byte {
	return append([]byte{side | rtsRaw, byte(len(raw))}, raw...)
}

// stepTime advances to the earliest timer (param 1) or by d microseconds.
func stepTime(param byte, d uint16) []byte {
	if param&1 != 0 {
		return []byte{param<<3 | rtsTime}
	}
	return append([]byte{param<<3 | rtsTime}, be16(d)...)
}

func stepRun(side, budget byte) []byte { return []byte{side | (budget-1)<<3 | rtsRun} }

func stepModify(side, param byte) []byte { return []byte{side | param<<3 | rtsModify} }

// fuzzEnd is one side of the fuzzed link: the end with its memory inside
// guards, and what was posted and completed on its queues.
type fuzzEnd struct {
	*end
	backing              []byte
	sendPosted, sendDone uint64 // IDs: posted ones are 1..sendPosted
	recvPosted, recvDone uint64
	state                State // as last seen, or as the program set it
	respPSN, compPSN     PSN   // as last seen (RC's PSN invariants)
}

func newFuzzEnd(t *testing.T, typ Type, num uint32, addr string) *fuzzEnd {
	backing := make([]byte, fuzzGuard+fuzzMRLen+fuzzGuard)
	for i := range backing {
		backing[i] = guardByte(i)
	}
	e := newEndOver(t, typ, num, addr, backing[fuzzGuard:fuzzGuard+fuzzMRLen])
	return &fuzzEnd{end: e, backing: backing}
}

func guardByte(i int) byte { return byte(i*131 + 7) }

// fuzzReader hands out the input; past its end it reads zeros.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) u8() byte {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *fuzzReader) u16() uint16 { return uint16(r.u8())<<8 | uint16(r.u8()) }

func (r *fuzzReader) bytes(n int) []byte {
	n = min(n, len(r.b))
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

type rtsProgram struct {
	t    *testing.T
	l    *link
	typ  Type
	a, b *fuzzEnd
	in   fuzzReader
	wcs  []WC
	pkt  [MaxPacketLen]byte
	// budget is what a Run after a delivered packet may send.
	budget int
}

func runRTSProgram(t *testing.T, in []byte) {
	r := fuzzReader{b: in}
	cfg := r.u8()
	typ := [...]Type{RC, UC, UD, RC}[cfg&3]
	retry, rnr := cfg>>2&7, cfg>>5&7
	a := newFuzzEnd(t, typ, 0x11, "10.0.0.1")
	b := newFuzzEnd(t, typ, 0x12, "10.0.0.2")
	l := connectLink(t, typ, retry, rnr, a.end, b.end)
	a.state, b.state = RTS, RTS
	for _, e := range []*fuzzEnd{a, b} {
		e.respPSN, e.compPSN = e.q.resp.psn, e.q.comp.psn
	}
	p := &rtsProgram{t: t, l: l, typ: typ, a: a, b: b, wcs: make([]WC, 16), budget: 1000}
	if v := r.u8(); v != 0 {
		p.budget = int(v)
	}
	p.in = r
	for step := 0; step < rtsMaxSteps && len(p.in.b) > 0; step++ {
		op := p.in.u8()
		x, y := a, b
		if op&0x80 != 0 {
			x, y = b, a
		}
		param := op >> 3 & 0xF
		switch op & 7 {
		case rtsPostSend:
			p.postSend(x, y, param)
		case rtsPostRecv:
			p.postRecv(x, param)
		case rtsDeliver:
			p.deliverCaptured(x, y, param)
		case rtsCrafted:
			p.inject(x, y, p.crafted(x, y))
		case rtsRaw:
			p.injectRaw(x, y)
		case rtsTime:
			p.advance(param)
		case rtsRun:
			budget := int(param) + 1
			x.q.Run(x.env, l.now, budget)
		case rtsModify:
			p.modify(x, param)
		}
		p.check(a)
		p.check(b)
	}
	// The end: both QPs to ERR; everything posted completes.
	for _, e := range []*fuzzEnd{a, b} {
		p.modify(e, 0)
		p.check(e)
	}
}

// sendOps are the WR opcodes the program posts, by QP type.
var sendOps = map[Type][]WROpcode{
	RC: {WRSend, WRSendWithImm, WRRDMAWrite, WRRDMAWriteWithImm, WRRDMARead, WRAtomicFetchAndAdd,
		WRAtomicCmpAndSwp, WRSendWithInv, WRFlush, WRAtomicWrite},
	UC: {WRSend, WRSendWithImm, WRRDMAWrite, WRRDMAWriteWithImm},
	UD: {WRSend, WRSendWithImm},
}

// postSend posts a send WR on x: opcode by param, then flags, length,
// local and remote offsets (mostly inside the regions, sometimes just
// outside them, where the keys must refuse the access).
func (p *rtsProgram) postSend(x, y *fuzzEnd, param byte) {
	ops := sendOps[p.typ]
	flags := p.in.u8()
	n := int(p.in.u16()) % 1100
	off := p.offset()
	roff := p.offset()
	wr := SendWR{ID: x.sendPosted + 1, Opcode: ops[int(param)%len(ops)], Imm: 0x5A, CompareAdd: 3, Swap: 4}
	if flags&1 != 0 {
		wr.Flags |= Signaled
	}
	if flags&2 != 0 {
		wr.Flags |= Solicited
	}
	if flags&4 != 0 {
		wr.Flags |= Fence
	}
	lkey, rkey := x.m.LKey(), y.m.RKey()
	if flags&8 != 0 {
		lkey ^= uint32(flags) << 8
	}
	if flags&16 != 0 {
		rkey ^= uint32(flags) << 8
	}
	wr.RemoteAddr, wr.RKey, wr.InvalidateRKey = addOff(y.m.IOVA(), roff), rkey, rkey
	if wr.Opcode.IsAtomic() {
		n = 8
		wr.RemoteAddr &^= 7
	}
	switch {
	case flags&32 != 0 && n <= 64 && wr.Opcode.AllowsInline():
		wr.Flags |= Inline
		wr.Inline = x.buf[:n]
	case flags&64 != 0 && n > 1:
		// Two SGEs: the message is split where the second starts.
		wr.SGL = []SGE{{Addr: addOff(x.m.IOVA(), off), Length: uint32(n / 2), LKey: lkey},
			{Addr: addOff(x.m.IOVA(), off+n), Length: uint32(n - n/2), LKey: lkey}}
	default:
		wr.SGL = []SGE{{Addr: addOff(x.m.IOVA(), off), Length: uint32(n), LKey: lkey}}
	}
	if p.typ.Datagram() {
		wr.AV = AddrVector{DGID: y.addr.Addr()}
		wr.RemoteQPN, wr.RemoteQKey = y.q.Num(), 0x80000000
		if flags&128 != 0 {
			wr.RemoteQKey = 0x1234
		}
	}
	if x.q.PostSend(&wr) == nil {
		x.sendPosted = wr.ID
	}
	x.q.Run(x.env, p.l.now, 1000)
}

// offset reads an offset into a region: mostly inside it, else up to 64
// bytes past either end.
func (p *rtsProgram) offset() int {
	v := int(p.in.u16()) % (fuzzMRLen + 128)
	if v < fuzzMRLen+64 {
		return v
	}
	return fuzzMRLen + 63 - v
}

func addOff(base uint64, off int) uint64 { return uint64(int64(base) + int64(off)) }

// postRecv posts a receive WR on x with one or two SGEs (param bit 0).
func (p *rtsProgram) postRecv(x *fuzzEnd, param byte) {
	off := p.offset()
	n := int(p.in.u16()) % 1500
	wr := RecvWR{ID: x.recvPosted + 1, SGL: []SGE{{Addr: addOff(x.m.IOVA(), off), Length: uint32(n), LKey: x.m.LKey()}}}
	if param&1 != 0 {
		wr.SGL = append(wr.SGL, SGE{Addr: addOff(x.m.IOVA(), off+n+8), Length: uint32(n), LKey: x.m.LKey()})
	}
	if param&2 != 0 {
		wr.SGL[0].LKey ^= 0x100
	}
	if x.q.PostRecv(&wr) == nil {
		x.recvPosted = wr.ID
	}
}

// deliverCaptured hands the packets x built to y: a mask byte drops
// packets among the first eight; param bit 0 delivers them in reverse,
// bit 1 twice; bit 2 keeps them captured (delivered again later).
func (p *rtsProgram) deliverCaptured(x, y *fuzzEnd, param byte) {
	mask := p.in.u8()
	pkts := x.env.pkts
	if param&4 == 0 {
		x.env.pkts = nil
	}
	if len(pkts) > 512 {
		pkts = pkts[len(pkts)-512:]
	}
	for i := range pkts {
		j := i
		if param&1 != 0 {
			j = len(pkts) - 1 - i
		}
		if j < 8 && mask&(1<<j) != 0 {
			continue
		}
		var pk wire.Packet
		if err := pk.Parse(pkts[j]); err != nil {
			p.t.Fatalf("QP %#x built a packet that does not parse: %v: % x", x.q.Num(), err, pkts[j])
		}
		for range 1 + int(param>>1&1) {
			p.receive(y, x, &pk)
		}
	}
}

// receive passes pk to x as the engine would: the per-QP checks first,
// then Receive and a Run.
func (p *rtsProgram) receive(x, from *fuzzEnd, pk *wire.Packet) {
	ri := RecvInfo{Src: from.addr, Dst: x.addr}
	if x.q.Check(pk, &ri, x.addr.Addr()) != DropNone {
		return
	}
	x.q.Receive(x.env, pk, &ri, p.l.now)
	x.q.Run(x.env, p.l.now, p.budget)
}

// craftOps are the opcodes crafted packets use, by QP type; an opcode of
// another transport is taken too now and then (Check drops it).
var craftOps = map[Type][]wire.Opcode{
	RC: {wire.RCSendFirst, wire.RCSendMiddle, wire.RCSendLast, wire.RCSendLastImm, wire.RCSendOnly, wire.RCSendOnlyImm,
		wire.RCWriteFirst, wire.RCWriteMiddle, wire.RCWriteLast, wire.RCWriteLastImm, wire.RCWriteOnly, wire.RCWriteOnlyImm,
		wire.RCReadRequest, wire.RCReadResponseFirst, wire.RCReadResponseMiddle, wire.RCReadResponseLast,
		wire.RCReadResponseOnly, wire.RCAck, wire.RCAtomicAck, wire.RCCompareSwap, wire.RCFetchAdd,
		wire.RCSendLastInv, wire.RCSendOnlyInv, wire.RCFlush, wire.RCAtomicWrite},
	UC: {wire.UCSendFirst, wire.UCSendMiddle, wire.UCSendLast, wire.UCSendLastImm, wire.UCSendOnly, wire.UCSendOnlyImm,
		wire.UCWriteFirst, wire.UCWriteMiddle, wire.UCWriteLast, wire.UCWriteLastImm, wire.UCWriteOnly, wire.UCWriteOnlyImm},
	UD: {wire.UDSendOnly, wire.UDSendOnlyImm},
}

// crafted builds a packet from the input as y would send it to x:
// opcode index; flags; PSN delta; RETH VA offset; DMA length; AETH
// syndrome and MSN; atomic operands; payload length (the payload is a
// pattern). A request's PSN is near x's expected request PSN, a
// response's near the oldest unacknowledged one (flags bit 2: near the
// next one sent). It returns nil when the headers do not encode.
func (p *rtsProgram) crafted(x, y *fuzzEnd) []byte {
	opi := p.in.u8()
	flags := p.in.u8()
	delta := int8(p.in.u8())
	vaOff := int(int16(p.in.u16()))
	dmaLen := uint32(p.in.u16())
	syn, msn := p.in.u8(), p.in.u8()
	swap, cmp, orig := p.in.u8(), p.in.u8(), p.in.u8()
	plen := int(p.in.u16()) % (2*256 + 8)
	ops := craftOps[p.typ]
	op := ops[int(opi)%len(ops)]
	if opi >= 0xF0 {
		all := craftOps[[...]Type{RC, UC, UD}[opi%3]]
		op = all[int(opi)%len(all)]
	}
	base := x.q.resp.psn
	if op.Info().Flags&wire.FlagRequest == 0 {
		base = x.q.comp.psn
		if flags&4 != 0 {
			base = x.q.req.psn
		}
	}
	h := wire.Headers{
		Opcode: op, PKey: DefaultPKey, DestQP: x.q.Num(), PSN: uint32(base.Add(uint32(int32(delta)))),
		AckReq: flags&1 != 0, SE: flags&2 != 0,
		VA: addOff(x.m.IOVA(), vaOff), RKey: x.m.RKey(), DMALen: dmaLen,
		SwapAdd: uint64(swap), Compare: uint64(cmp), OrigData: uint64(orig),
		Syndrome: wire.Syndrome(syn), MSN: uint32(msn),
		QKey: 0x1234, SrcQP: y.q.Num(), Imm: 0xC0FFEE,
	}
	if flags&8 != 0 {
		h.VA &^= 7
	}
	if flags&16 != 0 {
		h.RKey ^= uint32(flags) << 8
	}
	if flags&32 != 0 {
		h.InvRKey = x.m.RKey()
	}
	if flags&64 != 0 {
		h.QKey = 0x4321
	}
	payload := make([]byte, plen)
	for i := range payload {
		payload[i] = byte(i) ^ flags
	}
	n, err := h.Encode(p.pkt[:], payload)
	if err != nil {
		return nil
	}
	return append([]byte(nil), p.pkt[:n]...)
}

// injectRaw reads a length byte and that many bytes, aims them at x
// (their destination QPN is set to x's, as the engine's demultiplexing
// would have it) and injects them.
func (p *rtsProgram) injectRaw(x, y *fuzzEnd) {
	raw := append([]byte(nil), p.in.bytes(int(p.in.u8()))...)
	if len(raw) >= wire.BTHLen {
		wire.BTH(raw).SetDestQP(x.q.Num())
	}
	p.inject(x, y, raw)
}

func (p *rtsProgram) inject(x, y *fuzzEnd, raw []byte) {
	var pk wire.Packet
	if raw == nil || pk.Parse(raw) != nil {
		return
	}
	p.receive(x, y, &pk)
}

// advance moves time on: to the earliest armed timer (param bit 0) or by
// a delta read from the input, in microseconds; then both QPs' timers.
func (p *rtsProgram) advance(param byte) {
	if param&1 != 0 {
		d := p.a.q.Deadline()
		if bd := p.b.q.Deadline(); d.IsZero() || (!bd.IsZero() && bd.Before(d)) {
			d = bd
		}
		if d.After(p.l.now) {
			p.l.now = d
		}
	} else {
		p.l.now = p.l.now.Add(time.Duration(p.in.u16()) * time.Microsecond)
	}
	for _, e := range []*fuzzEnd{p.a, p.b} {
		e.q.OnTimer(e.env, p.l.now, 1000)
	}
}

// modify is what the application may do to a QP in RTS: move it to ERR
// (param 0 mod 4), drain it (SQD) or resume it from SQD to RTS.
func (p *rtsProgram) modify(x *fuzzEnd, param byte) {
	switch param % 4 {
	case 0:
		_ = x.q.Modify(&Attr{State: Err}, AttrState, p.l.now)
	case 1:
		_ = x.q.Modify(&Attr{State: SQD}, AttrState, p.l.now)
	case 2:
		_ = x.q.Modify(&Attr{State: RTS}, AttrState, p.l.now)
	default:
		return
	}
	x.state = x.q.State()
	x.q.Run(x.env, p.l.now, 1000)
}

// check asserts the invariants on x after a step.
func (p *rtsProgram) check(x *fuzzEnd) {
	t := p.t
	for i := 0; i < fuzzGuard; i++ {
		j := fuzzGuard + fuzzMRLen + i
		if x.backing[i] != guardByte(i) || x.backing[j] != guardByte(j) {
			t.Fatalf("QP %#x: memory outside its region changed (guard byte %d or %d)", x.q.Num(), i, j)
		}
	}
	p.drainCQ(x, x.scq, &x.sendDone, x.sendPosted, "send")
	p.drainCQ(x, x.rcq, &x.recvDone, x.recvPosted, "recv")
	if p.typ == RC {
		p.checkPSNs(x)
	}
	s := x.q.State()
	if s != x.state {
		ok := s == Err && (x.state == RTS || x.state == SQD || x.state == SQE) ||
			s == SQE && x.state == RTS && p.typ != RC
		if !ok {
			t.Fatalf("QP %#x (%v) went from %v to %v on its own", x.q.Num(), p.typ, x.state, s)
		}
		x.state = s
	}
	if s == Err {
		x.q.Run(x.env, p.l.now, 1000)
		if n := x.q.SendQueueLen(); n != 0 {
			t.Fatalf("QP %#x in ERR: %d send WRs not flushed by Run", x.q.Num(), n)
		}
		if n := x.q.RecvQueueLen(); n != 0 || x.q.resp.recvValid {
			t.Fatalf("QP %#x in ERR: %d receive WRs not flushed by Run (one in progress: %v)", x.q.Num(), n, x.q.resp.recvValid)
		}
		p.drainCQ(x, x.scq, &x.sendDone, x.sendPosted, "send")
		p.drainCQ(x, x.rcq, &x.recvDone, x.recvPosted, "recv")
	}
}

// checkPSNs asserts RC's PSN invariants on x (see FuzzRTSQP).
func (p *rtsProgram) checkPSNs(x *fuzzEnd) {
	q := x.q
	if d := q.resp.psn.Diff(x.respPSN); d < 0 {
		p.t.Fatalf("QP %#x: the responder's expected PSN went back from %v to %v", q.Num(), x.respPSN, q.resp.psn)
	}
	if d := q.comp.psn.Diff(x.compPSN); d < 0 {
		p.t.Fatalf("QP %#x: the oldest unacknowledged PSN went back from %v to %v", q.Num(), x.compPSN, q.comp.psn)
	}
	if d := q.comp.psn.Diff(q.req.psn); d > 0 {
		p.t.Fatalf("QP %#x: acknowledged up to %v, past the next PSN to send %v", q.Num(), q.comp.psn, q.req.psn)
	}
	x.respPSN, x.compPSN = q.resp.psn, q.comp.psn
}

// drainCQ polls cq empty, checking each completion is for a WR posted on
// x's queue and comes after the last one.
func (p *rtsProgram) drainCQ(x *fuzzEnd, cq *CQ, done *uint64, posted uint64, queue string) {
	for {
		n := cq.Poll(p.wcs)
		if n == 0 {
			return
		}
		for _, wc := range p.wcs[:n] {
			if wc.QPNum != x.q.Num() {
				p.t.Fatalf("QP %#x %s CQ: completion for QP %#x", x.q.Num(), queue, wc.QPNum)
			}
			if wc.ID <= *done || wc.ID > posted {
				p.t.Fatalf("QP %#x %s CQ: completion of WR %d (%v) after WR %d, %d posted",
					x.q.Num(), queue, wc.ID, wc.Status, *done, posted)
			}
			*done = wc.ID
		}
	}
}
