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
		w := q.sq.at(q.req.idx)
		if w.state != wqePosted {
			q.req.idx++
			continue
		}
		if q.attr.State == SQD && q.req.idx >= q.req.startedEnd {
			// Draining: finish (and resend) what had started, start
			// nothing new. Unlike rxe, which in SQD only continues a
			// WQE in mid-message, a WQE rewound by a retry is resent,
			// or the drain would never end.
			break
		}
		if w.sent == 0 && !w.hasRdAtomic {
			if w.wr.Flags&Fence != 0 && q.req.idx != q.sq.head {
				break // wait for every earlier WQE to complete
			}
			if w.wr.Opcode.IsLocal() {
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
				continue
			}
			if w.isReadOrAtomic() {
				if q.req.rdAtomic >= q.maxRdAtomic() {
					break
				}
				q.req.rdAtomic++
				w.hasRdAtomic = true
			}
		}
		if q.typ == RC && q.req.psn.Diff(q.comp.psn) > MaxUnackedPSNs {
			break
		}
		finished, st := q.sendRequest(env, w)
		q.markStarted()
		budget--
		if st != WCSuccess {
			w.status = st
			w.state = wqeError
			q.req.stopped = true
			q.req.idx++
			break
		}
		if q.typ == RC && q.timeout > 0 && q.retransmitAt.IsZero() {
			q.retransmitAt = now.Add(q.timeout)
		}
		if finished {
			if q.typ == RC {
				w.state = wqePending
			} else {
				w.state = wqeDone
			}
			q.req.idx++
		}
	}
	q.completeDone()
	return budget == 0 && q.req.idx != tail && !q.req.stopped && q.rnrAt.IsZero()
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
			return wire.RCSendOnlyInv // RC only; UC has no invalidate opcode
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

// sendRequest builds and transmits the next packet of w. finished reports
// that w needs no more request packets.
func (q *QP) sendRequest(env Env, w *wqe) (finished bool, st WCStatus) {
	mtu := q.mtu
	wr := &w.wr
	// What a packet that cannot be built or sent must not have advanced
	// (rxe updates the WQE and PSN only once the packet is out).
	psn0, noack0, sent0, first0, last0 := q.req.psn, q.req.noack, w.sent, w.firstPSN, w.lastPSN
	fail := func(st WCStatus) (bool, WCStatus) {
		q.req.psn, q.req.noack, w.sent, w.firstPSN, w.lastPSN = psn0, noack0, sent0, first0, last0
		return false, st
	}
	h := wire.Headers{PKey: DefaultPKey, DestQP: q.attr.DestQPN, PSN: uint32(q.req.psn)}
	av := &q.attr.AV
	remaining := w.length - w.sent
	payload := 0
	countSend := false // the first packet of a SEND: rdma_sends once it is out
	switch op := wr.Opcode; {
	case op == WRRDMARead:
		h.Opcode = wire.RCReadRequest
		h.VA, h.RKey, h.DMALen = wr.RemoteAddr+uint64(w.sent), wr.RKey, uint32(remaining)
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
		payload = 8
	default: // SEND and WRITE variants
		if q.typ.Datagram() && w.length > mtu {
			return false, WCLocLenErr // a UD message is one packet
		}
		first := w.sent == 0
		payload = min(remaining, mtu)
		last := remaining <= mtu
		h.Opcode = sendOpcode(q.typ, op, first, last)
		if first {
			n := pktCount(w.length, mtu)
			w.firstPSN, w.lastPSN = q.req.psn, q.req.psn.Add(uint32(n-1))
			countSend = op.IsSend()
		}
		if op == WRRDMAWrite || op == WRRDMAWriteWithImm {
			h.VA, h.RKey, h.DMALen = wr.RemoteAddr, wr.RKey, uint32(w.length)
		}
		h.Imm = wr.Imm
		h.InvRKey = wr.InvalidateRKey
		if q.typ.Datagram() {
			h.DestQP = wr.RemoteQPN
			h.QKey = wr.RemoteQKey
			if h.QKey&0x80000000 != 0 {
				h.QKey = q.attr.QKey
			}
			h.SrcQP = q.num
			av = &wr.AV
		}
		q.req.psn = q.req.psn.Next()
		q.req.noteSent()
		finished = last
		if q.typ == RC { // rxe sets no AckReq on UC/UD (see the captures)
			q.req.noack++
			h.AckReq = last || q.req.noack > MaxPktPerAck
		}
		h.SE = last && wr.Flags&Solicited != 0 && (op.IsSend() || op == WRRDMAWriteWithImm)
	}
	if w.isReadOrAtomic() {
		// One request packet, answered by the PSNs of its responses: a
		// READ's one per MTU of what remains, any other one.
		n := 1
		if wr.Opcode == WRRDMARead {
			n = pktCount(remaining, mtu)
		}
		w.firstPSN, w.lastPSN = q.req.psn, q.req.psn.Add(uint32(n-1))
		q.req.psn = q.req.psn.Add(uint32(n))
		q.req.noteSent()
		h.AckReq, finished = true, true
	}
	if h.AckReq {
		q.req.noack = 0
	}
	buf := env.TxBuffer()
	off, n, err := h.EncodeHeaders(buf, payload)
	if err != nil {
		return fail(WCLocQPOpErr)
	}
	from := w.sent
	if wr.Opcode == WRAtomicWrite {
		from = 0
	}
	if payload == 0 {
		err = env.Transmit(n, av)
	} else if ok, terr := q.transmitPayload(env, w, buf, off, from, payload, n, av); !ok {
		return fail(WCLocProtErr)
	} else {
		err = terr
	}
	if err != nil {
		// rxe_requester on an rxe_xmit_packet (or address vector)
		// error: the WQE completes with LOC_QP_OP_ERR and the QP
		// moves to ERR, flushing the WQEs after it.
		return fail(WCLocQPOpErr)
	}
	if wr.Opcode != WRRDMARead {
		w.sent += payload
	}
	if countSend {
		q.ctr.RDMASends.Add(1)
	}
	q.ctr.SentPkts.Add(1)
	return finished, WCSuccess
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
