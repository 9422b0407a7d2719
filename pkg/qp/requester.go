package qp

import (
	"time"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/wire"
)

// requester is the send side of rxe_req.c: it turns WQEs into request
// packets, segmented by the path MTU.
type requester struct {
	psn PSN // PSN of the next request packet
	// sentEnd is one past the highest PSN a request has used: psn goes
	// back on go-back-N, sentEnd does not. A response past it answers
	// nothing we sent (a ghost).
	sentEnd  PSN
	idx      uint64 // next WQE to work on (sq.head <= idx <= tail)
	noack    int    // packets sent since the last AckReq
	rdAtomic int    // max_rd_atomic credits in use
	stopped  bool   // a WQE failed locally: send nothing more
	// startedEnd is one past the newest WQE the requester has started
	// (sent a packet of, or executed). It survives go-back-N, which
	// rewinds idx: in SQD the WQEs below it are the ones to finish
	// (retransmissions included) and those from it on must not start.
	startedEnd uint64
}

// LocalOps carries out the WRs that touch only local memory objects
// (LOCAL_INV, BIND_MW, REG_MR). The engine supplies it from pkg/mr.
type LocalOps interface {
	Execute(q *QP, wr *SendWR) WCStatus
}

// SetLocalOps installs the executor of local WRs.
func (q *QP) SetLocalOps(l LocalOps) { q.localOps = l }

func (q *QP) maxRdAtomic() int {
	if q.attr.MaxRdAtomic == 0 {
		// rxe would stall forever on READs with max_rd_atomic 0; allowing
		// one outstanding keeps the QP usable and is what IBA intends as
		// the minimum for a QP that issues READs.
		return 1
	}
	return int(q.attr.MaxRdAtomic)
}

// The requester passes each WQE through the steps of rxe's requester
// (rxe_req.c), one function each: Run picks the next WQE (req_next_wqe),
// holds it while the SQ drains (drainHolds) or a fence stands (fenced),
// carries out a local operation at once (executeLocal), takes a
// max_rd_atomic credit for a READ or atomic (takeRdAtomic), and stops at
// the edge of the PSN window (windowFull). sendNext then sends one packet
// (sendRequest: requestHeaders, the header as init_req_packet and
// next_opcode build it; wantsAck; transmitRequest, finish_packet and
// rxe_xmit_packet; updateRequestState, update_wqe_psn and update_state)
// and moves the WQE on (update_wqe_state) or fails it.

// Run lets the requester send up to budget packets and retires WQEs that
// need no response. It reports whether work remains that only more budget
// (not an ACK or a timer) would let it do.
func (q *QP) Run(env Env, now time.Time, budget int) (more bool) {
	if budget = q.runResponder(env, budget); q.resp.replying() {
		return true // READ responses first (readreply.go); the rest next turn
	}
	switch q.attr.State {
	case Err:
		q.flush()
		return false
	case RTS, SQD:
	default:
		return false
	}
	tail := q.sq.published()
	for budget > 0 && q.req.idx != tail && !q.req.stopped && q.rnrAt.IsZero() {
		if q.comp.readHold && q.req.idx != q.sq.head {
			break // the oldest READ is asked for again first (readkeep.go)
		}
		w := q.sq.at(q.req.idx)
		if w.state != wqePosted {
			if w.kept && q.req.psn == w.firstPSN {
				q.req.psn = w.lastPSN.Next() // its reply is in: not asked for again
			}
			q.req.idx++ // sent whole (or executed): the completer has it now
			continue
		}
		if q.drainHolds() {
			break
		}
		if w.sent == 0 && !w.hasRdAtomic { // the WQE's first packet
			if q.fenced(w) {
				break
			}
			if w.wr.Opcode.IsLocal() {
				q.executeLocal(w)
				continue
			}
			if !q.takeRdAtomic(w) {
				break
			}
		}
		if q.windowFull() {
			break
		}
		budget--
		if !q.sendNext(env, w, now) {
			break
		}
	}
	q.completeDone()
	return budget == 0 && q.req.idx != tail && !q.req.stopped && q.rnrAt.IsZero()
}

// drainHolds reports that the WQE at req.idx must wait because the SQ is
// draining (SQD): finish (and resend) what had started, start nothing
// new. Unlike rxe, which in SQD only continues a WQE in mid-message, a
// WQE rewound by a retry is resent, or the drain would never end.
func (q *QP) drainHolds() bool {
	return q.attr.State == SQD && q.req.idx >= q.req.startedEnd
}

// fenced reports that w carries the fence flag and an earlier WQE is
// still outstanding: w waits until every earlier one has completed
// (rxe_wqe_is_fenced; IBA's fence orders a WQE after earlier READs and
// atomics, and rxe, like us, waits for all of them).
func (q *QP) fenced(w *wqe) bool {
	return w.wr.Flags&Fence != 0 && q.req.idx != q.sq.head
}

// executeLocal carries out a LOCAL_INV, BIND_MW or REG_MR WQE at once
// (rxe_do_local_ops): it touches only local memory objects and sends
// nothing. It completes in order behind the WQEs before it; a failure
// stops the requester, and the QP moves to ERR when the completer reaches
// it.
func (q *QP) executeLocal(w *wqe) {
	st := WCLocQPOpErr
	if q.localOps != nil {
		st = q.localOps.Execute(q, &w.wr)
	}
	q.markStarted()
	w.status = st
	if st == WCSuccess {
		w.state = wqeDone
	} else {
		w.state = wqeError
		q.req.stopped = true
	}
	q.req.idx++
}

// takeRdAtomic takes one of the max_rd_atomic credits for a READ or
// atomic before its request goes out (rxe's check for rd_atomic in
// rxe_requester): the responder keeps only that many responses for
// replay, so more outstanding would be NAKed. false: w waits for a credit,
// which the completer returns when an earlier one completes.
func (q *QP) takeRdAtomic(w *wqe) bool {
	if !w.isReadOrAtomic() {
		return true
	}
	if q.req.rdAtomic >= q.maxRdAtomic() {
		return false
	}
	q.req.rdAtomic++
	w.hasRdAtomic = true
	return true
}

// windowFull reports that an RC requester is more than MaxUnackedPSNs
// ahead of the oldest unacknowledged PSN (rxe's RXE_MAX_UNACKED_PSNS
// check): the responder's duplicate detection covers only so far back,
// and it bounds what a go-back-N must resend.
func (q *QP) windowFull() bool {
	return q.typ == RC && q.req.psn.Diff(q.comp.psn) > MaxUnackedPSNs || q.cwndFull()
}

// sendNext sends the next packet of w and moves w on: once its last
// request packet is out an RC WQE waits for its response (pending), a UC
// or UD one is done. The first packet out arms the retransmit timer. A
// packet that could not be built or sent fails w (in order, once the
// completer reaches it) and stops the requester; false then.
func (q *QP) sendNext(env Env, w *wqe, now time.Time) bool {
	if q.udTooLong(w) {
		q.completeUnsent(w) // ud_toolong.go
		return true
	}
	psn, resent := q.req.psn, q.req.psn.Diff(q.req.sentEnd) < 0
	finished, st := q.sendRequest(env, w)
	q.markStarted()
	if st != WCSuccess {
		w.status = st
		w.state = wqeError
		q.req.stopped = true
		q.req.idx++
		return false
	}
	if q.typ == RC && q.timeout > 0 && q.retransmitAt.IsZero() {
		q.retransmitAt = now.Add(q.timeout)
	}
	q.noteRequestSent(psn, resent, now)
	if finished {
		if q.typ == RC {
			w.state = wqePending
		} else {
			w.state = wqeDone
		}
		q.req.idx++
	}
	return true
}

// markStarted records that the WQE at req.idx has started.
func (q *QP) markStarted() {
	if q.req.idx >= q.req.startedEnd {
		q.req.startedEnd = q.req.idx + 1
	}
}

// sendOpcode picks the opcode of the next packet of a SEND or WRITE.
func sendOpcode(t Type, op WROpcode, first, last bool) wire.Opcode {
	var base wire.Opcode
	switch t {
	case UC:
		base = 0x20
	case UD, GSI:
		if op == WRSendWithImm {
			return wire.UDSendOnlyImm
		}
		return wire.UDSendOnly
	}
	write := op == WRRDMAWrite || op == WRRDMAWriteWithImm
	imm := op.HasImm()
	inv := op == WRSendWithInv
	switch {
	case first && last:
		switch {
		case write && imm:
			return base + wire.RCWriteOnlyImm
		case write:
			return base + wire.RCWriteOnly
		case imm:
			return base + wire.RCSendOnlyImm
		case inv:
			return wire.RCSendOnlyInv // RC only (requestHeaders)
		default:
			return base + wire.RCSendOnly
		}
	case first:
		if write {
			return base + wire.RCWriteFirst
		}
		return base + wire.RCSendFirst
	case last:
		switch {
		case write && imm:
			return base + wire.RCWriteLastImm
		case write:
			return base + wire.RCWriteLast
		case imm:
			return base + wire.RCSendLastImm
		case inv:
			return wire.RCSendLastInv
		default:
			return base + wire.RCSendLast
		}
	default:
		if write {
			return base + wire.RCWriteMiddle
		}
		return base + wire.RCSendMiddle
	}
}

// pktCount is the number of packets a message of n bytes takes.
func pktCount(n, mtu int) int {
	if n <= 0 {
		return 1
	}
	return (n + mtu - 1) / mtu
}

// request is the next request packet of a WQE as requestHeaders plans
// it, from the WQE and the requester's state without changing either:
// rxe updates the WQE and the PSN only once the packet is out, so a
// packet that cannot be built or sent leaves no trace.
type request struct {
	h       wire.Headers
	av      *AddrVector
	payload int // payload bytes
	from    int // offset in the message of the payload's first byte
	// psns is how many PSNs the packet takes: one, or for a READ one per
	// response it asks for. span, when not zero, is the number of PSNs of
	// the whole WQE starting at this packet's (its first packet, or any
	// READ or atomic request, retried or not).
	psns, span uint32
	last       bool // w needs no more request packets after this one
	countSend  bool // the first packet of a SEND: rdma_sends once it is out
}

// sendRequest builds and transmits the next packet of w. finished reports
// that w needs no more request packets.
func (q *QP) sendRequest(env Env, w *wqe) (finished bool, st WCStatus) {
	r, st := q.requestHeaders(w)
	if st != WCSuccess {
		return false, st
	}
	r.h.AckReq = q.wantsAck(w, &r)
	if st := q.transmitRequest(env, w, &r); st != WCSuccess {
		return false, st
	}
	q.updateRequestState(w, &r)
	return r.last, WCSuccess
}

// requestHeaders is rxe's next_opcode and init_req_packet: the opcode of
// w's next packet and the headers it carries, the payload it takes (at
// most one MTU), and the PSNs it uses. A READ asks in one packet for all
// that remains; an atomic, FLUSH or ATOMIC_WRITE is one packet; a SEND
// or WRITE is cut into MTU-sized packets, of which a UD message has only
// one (sendNext completes a longer one unsent, ud_toolong.go).
func (q *QP) requestHeaders(w *wqe) (request, WCStatus) {
	wr := &w.wr
	mtu := q.mtu
	r := request{
		h:    wire.Headers{PKey: DefaultPKey, DestQP: q.attr.DestQPN, PSN: uint32(q.req.psn)},
		av:   &q.attr.AV,
		from: w.sent,
		psns: 1,
	}
	h := &r.h
	remaining := w.length - w.sent
	switch op := wr.Opcode; {
	case op == WRRDMARead:
		h.Opcode = wire.RCReadRequest
		h.VA, h.RKey, h.DMALen = wr.RemoteAddr+uint64(w.sent), wr.RKey, uint32(remaining)
		// Answered by one response PSN per MTU of what remains.
		r.psns = uint32(pktCount(remaining, mtu))
	case op.IsAtomic():
		h.Opcode = wire.RCFetchAdd
		h.VA, h.RKey, h.SwapAdd = wr.RemoteAddr, wr.RKey, wr.CompareAdd
		if op == WRAtomicCmpAndSwp {
			h.Opcode = wire.RCCompareSwap
			h.Compare, h.SwapAdd = wr.CompareAdd, wr.Swap
		}
	case op == WRFlush:
		h.Opcode = wire.RCFlush
		h.VA, h.RKey, h.DMALen = wr.RemoteAddr, wr.RKey, uint32(w.length)
		h.FlushPlacement, h.FlushSelectivity = uint8(wr.CompareAdd), uint8(wr.Swap)
	case op == WRAtomicWrite:
		h.Opcode = wire.RCAtomicWrite
		h.VA, h.RKey, h.DMALen = wr.RemoteAddr, wr.RKey, 8
		r.payload, r.from = 8, 0
	case op == WRSendWithInv && q.typ != RC:
		// UC and UD have no SEND_WITH_INV packet: rxe's next_opcode_uc
		// and next_opcode_ud find none and the WQE fails.
		return request{}, WCLocQPOpErr
	default: // SEND and WRITE variants (a UD one fits a packet: sendNext)
		first := w.sent == 0
		r.payload = min(remaining, mtu)
		r.last = remaining <= mtu
		h.Opcode = sendOpcode(q.typ, op, first, r.last)
		if first {
			r.span = uint32(pktCount(w.length, mtu))
			r.countSend = op.IsSend()
		}
		if op == WRRDMAWrite || op == WRRDMAWriteWithImm {
			h.VA, h.RKey, h.DMALen = wr.RemoteAddr, wr.RKey, uint32(w.length)
		}
		h.Imm = wr.Imm
		h.InvRKey = wr.InvalidateRKey
		if q.typ.Datagram() {
			h.DestQP = wr.RemoteQPN
			h.QKey = q.sendQKey(wr.RemoteQKey)
			h.SrcQP = q.num
			r.av = &wr.AV
		}
		h.SE = r.last && wr.Flags&Solicited != 0 && (op.IsSend() || op == WRRDMAWriteWithImm)
		return r, WCSuccess
	}
	// A READ or atomic is one request packet; its responses use its PSNs.
	r.span, r.last = r.psns, true
	return r, WCSuccess
}

// wantsAck decides the AckReq bit: every READ and atomic asks for its
// response; an RC SEND or WRITE asks on its last packet, and after
// ackEvery packets without one so that the responder's ACKs keep the
// window moving during a long message. rxe sets no AckReq on UC or UD
// (see the captures): nothing would answer.
func (q *QP) wantsAck(w *wqe, r *request) bool {
	switch {
	case w.isReadOrAtomic():
		return true
	case q.typ != RC:
		return false
	default:
		return r.last || q.req.noack+1 > q.ackEvery()
	}
}

// ackEvery is how many packets of a message may go without AckReq:
// rxe's MaxPktPerAck, or half the congestion window when that is less.
// A responder acknowledges only a packet that asks (rxe's and ours), so
// a window used up by packets that did not ask would get no answer and
// wait for the retransmit timer: against rxe at MTU 1024 with 1% loss, a
// window halved to 64 PSNs or less stopped inside every 64-packet
// message after a loss, and the fast retransmit timer (9-10 ms under
// TCG) resent what rxe already had (issue 14, goal 7). With an ACK asked
// for at least every half window, the answer to the first half comes
// back while the second is in flight. The full window (MaxUnackedPSNs,
// twice MaxPktPerAck) asks exactly as rxe does.
func (q *QP) ackEvery() int {
	return min(MaxPktPerAck, q.rec.cwnd/2) // cwnd >= minCwnd
}

// transmitRequest is rxe's finish_packet and rxe_xmit_packet: encode the
// headers into the Env's buffer, add the payload from the WQE's memory
// (or hand it to a PayloadEnv where it lies) and send. A payload outside
// the local keys' memory is LOC_PROT_ERR; an encoding or transmit error
// is LOC_QP_OP_ERR, as rxe_requester completes a WQE whose
// rxe_xmit_packet (or address vector) failed, moving the QP to ERR and
// flushing the WQEs after it.
func (q *QP) transmitRequest(env Env, w *wqe, r *request) WCStatus {
	buf := env.TxBuffer()
	off, n, err := r.h.EncodeHeaders(buf, r.payload)
	if err != nil {
		return WCLocQPOpErr
	}
	if r.payload == 0 {
		err = env.Transmit(n, r.av)
	} else if ok, terr := q.transmitPayload(env, w, buf, off, r.from, r.payload, n, PSN(r.h.PSN).Diff(q.req.sentEnd) < 0, r.av); !ok {
		return WCLocProtErr
	} else {
		err = terr
	}
	if err != nil {
		return WCLocQPOpErr
	}
	return WCSuccess
}

// updateRequestState is rxe's update_wqe_psn and update_state, once the
// packet is out: the WQE learns its PSNs (from its first packet on, so
// the completer can match responses to it), the requester's PSN and
// sentEnd move past the packet, the count of packets since an AckReq
// restarts or grows, and the bytes sent move on (a READ's advance as its
// responses arrive instead).
func (q *QP) updateRequestState(w *wqe, r *request) {
	psn := PSN(r.h.PSN)
	if r.span > 0 {
		w.firstPSN, w.lastPSN = psn, psn.Add(r.span-1)
	}
	q.req.psn = psn.Add(r.psns)
	q.req.noteSent()
	switch {
	case r.h.AckReq:
		q.req.noack = 0
	case q.typ == RC:
		q.req.noack++
	}
	if w.wr.Opcode != WRRDMARead {
		w.sent += r.payload
	}
	if r.countSend {
		q.ctr.RDMASends.Add(1)
	}
	q.ctr.SentPkts.Add(1)
}

// gather copies the message bytes [off, off+len(dst)) of w into dst.
func (q *QP) gather(w *wqe, dst []byte, off int) bool {
	if w.wr.Flags&Inline != 0 {
		copy(dst, w.inline[off:])
		return true
	}
	for i := range w.sgl {
		if len(dst) == 0 {
			break
		}
		s := &w.sgl[i]
		l := int(s.Length)
		if off >= l {
			off -= l
			continue
		}
		n := min(l-off, len(dst))
		r, err := q.mem.Lookup(s.LKey, mr.LKey, q.pd, s.Addr+uint64(off), uint64(n), 0)
		if err != nil {
			return false
		}
		copy(dst[:n], r.Bytes())
		r.Release()
		dst = dst[n:]
		off = 0
	}
	return len(dst) == 0
}

// scatter copies src into the SGE list sgl starting at byte off of the
// list, checking local write access. It reports false on a bad lkey or
// when src does not fit (overflow is reported separately by fits).
func (q *QP) scatter(sgl []SGE, src []byte, off int) (ok bool) {
	for i := range sgl {
		if len(src) == 0 {
			break
		}
		s := &sgl[i]
		l := int(s.Length)
		if off >= l {
			off -= l
			continue
		}
		n := min(l-off, len(src))
		r, err := q.mem.Lookup(s.LKey, mr.LKey, q.pd, s.Addr+uint64(off), uint64(n), mr.LocalWrite)
		if err != nil {
			return false
		}
		copy(r.Bytes(), src[:n])
		r.Release()
		src = src[n:]
		off = 0
	}
	return len(src) == 0
}

// noteSent moves sentEnd up to psn after psn advanced.
func (r *requester) noteSent() {
	if r.psn.Diff(r.sentEnd) > 0 {
		r.sentEnd = r.psn
	}
}
