package qp

import (
	"encoding/binary"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/wire"
)

// responder is the receive side of rxe_resp.c.
type responder struct {
	psn PSN // next request PSN expected
	// ackPSN follows the last SEND, WRITE or single-packet operation
	// executed (rxe's resp.ack_psn; a READ does not move it): a duplicate
	// SEND or WRITE is acknowledged at ackPSN-1, as rxe does.
	ackPSN  PSN
	msn     uint32 // message sequence number (24 bits)
	opcode  int    // opcode of the multi-packet message in progress, -1 none
	sentNAK bool   // a PSN sequence NAK was sent for the current gap
	nakDebt uint16 // sequence NAKs sent lately, in nakCost units (allowNAK)
	dropMsg bool   // UC: drop the rest of a message after a gap
	// replayEpoch counts the requests taken in sequence: READ replay
	// bounds hold only while it stands still (allowReplay).
	replayEpoch uint32
	// commEst: a request was taken in sequence since the QP left RESET,
	// and the communication-established event raised (commEstablished).
	commEst bool

	recv      RecvWR // receive WR the current SEND (or WRITE_IMM) fills
	recvValid bool
	recvOff   int
	recvLen   int // recv.Len()

	va     uint64 // WRITE in progress: next address
	rkey   uint32
	resid  int // bytes still to come
	length int // RETH DMA length

	res     []resource // READ/atomic responder resources (max_dest_rd_atomic)
	resNext int

	// reply is the READ reply being sent, a budget per Run (readreply.go);
	// held are the requests that arrived meanwhile, in order (a ring of
	// heldLen from heldHead), and heldPkt parses the one being processed.
	reply    readCursor
	held     []heldRequest
	heldHead int
	heldLen  int
	heldPkt  wire.Packet

	// persist is the FLUSH to persistence waiting for its msync
	// (persist.go); persistGen numbers them and survives reset, so a
	// completion of a FLUSH from before a reset is recognised as stale.
	persist    persistWait
	persistGen uint64
}

// resource remembers an executed READ or atomic so a duplicate request is
// answered again instead of executed again.
type resource struct {
	kind              uint8 // resNone, resRead, resAtomic
	firstPSN, lastPSN PSN
	orig              uint64
	// A READ's target (rxe's res->read va_org, length, rkey): a duplicate
	// must ask for it or a part of it.
	va     uint64
	length uint64
	rkey   uint32
	// Replays of a READ (allowReplay): the PSN of the latest, the bytes
	// replayed since the last one that moved on, and the responder's
	// replayEpoch they were counted in.
	replayPSN   PSN
	replayBytes uint64
	replayEpoch uint32
}

// Sequence NAK rate limit. RoCE cannot authenticate a packet, so anyone
// who can reach the port can send a request with a PSN ahead of the
// expected one; each such gap makes us NAK, and each NAK makes the peer
// go back and resend its whole window. One NAK per gap (sentNAK) bounds
// that to one per in-order request; the debt bounds it further to one per
// nakCost in-order requests after a burst of nakBurst. A real loss (even
// 10% of packets) costs far fewer: its retransmission arrives in order.
// A NAK not sent is counted (naks_limited); the requester then recovers
// by its retransmit timer, as it does when a NAK is lost.
const (
	nakCost  = 4
	nakBurst = 8
)

// allowNAK reports whether a sequence NAK may be sent now, and charges it.
func (r *responder) allowNAK() bool {
	if r.nakDebt+nakCost > nakCost*nakBurst {
		return false
	}
	r.nakDebt += nakCost
	return true
}

// maxReplaysWithoutProgress bounds the bytes replayed for one READ by
// retries that start no later than the previous one, in READ lengths,
// while no new request arrives. A requester goes back to the first PSN it
// has not received, which only moves forward, and resends every READ
// after it whole: a READ behind a gap is asked for again on every retry
// of the gap. So the bound must cover a requester's retries in a row
// without progress: retry_cnt + 1 local ACK timeouts, and rxed's fast
// retransmits between them (recovery.go: doubling from minRTO up to a
// quarter of the timeout, about 9 in the first timeout and 4 in each
// after, 45 in all with retry_cnt 7). Any new request in sequence shows
// a requester that moves on and starts every count anew (replayEpoch).
// A burst of identical duplicates with nothing new between them (each a
// full replay: one small request, a whole READ of responses) is an
// amplification attack, not a requester: past the bound they are dropped
// and counted (replays_limited), and the QP is unharmed. The bound was
// 16 until a READ stream at 20% loss was refused the replays of the READs
// behind a stuck one for good and failed with RETRY_EXC_ERR.
const maxReplaysWithoutProgress = 64

// allowReplay accounts a replay of n bytes of res from psn, epoch being
// the responder's replayEpoch, and reports whether it may be sent.
func (res *resource) allowReplay(psn PSN, n uint64, epoch uint32) bool {
	if res.replayBytes == 0 || res.replayEpoch != epoch || res.replayPSN.Less(psn) {
		res.replayPSN, res.replayBytes, res.replayEpoch = psn, max(n, 1), epoch
		return true
	}
	if res.replayBytes+n > maxReplaysWithoutProgress*max(res.length, 1) {
		return false
	}
	res.replayBytes += max(n, 1)
	return true
}

const (
	resNone uint8 = iota
	resRead
	resAtomic
)

func (r *responder) reset() {
	res, held, gen := r.res, r.held, r.persistGen
	*r = responder{opcode: -1, res: res, held: held, persistGen: gen}
	clear(r.res)
}

func (r *responder) resizeResources(n int) {
	if n < 1 {
		n = 1
	}
	if len(r.res) != n {
		r.res = make([]resource, n)
		r.resNext = 0
	}
}

func (r *responder) newResource() *resource {
	if len(r.res) == 0 {
		r.res = make([]resource, 1)
	}
	x := &r.res[r.resNext]
	r.resNext = (r.resNext + 1) % len(r.res)
	return x
}

func (r *responder) findResource(psn PSN) *resource {
	for i := range r.res {
		x := &r.res[i]
		if x.kind != resNone && x.firstPSN.LessEq(psn) && psn.LessEq(x.lastPSN) {
			return x
		}
	}
	return nil
}

// sendAck sends an ACK or NAK with the given syndrome for psn.
func (q *QP) sendAck(env Env, syn wire.Syndrome, psn PSN) {
	q.sendResponse(env, wire.Headers{Opcode: wire.RCAck, Syndrome: syn}, psn)
}

func (q *QP) sendAtomicAck(env Env, psn PSN, orig uint64) {
	q.sendResponse(env, wire.Headers{Opcode: wire.RCAtomicAck, Syndrome: ackUnlimited, OrigData: orig}, psn)
}

// sendResponse completes h (no payload) as a response to psn and sends it.
func (q *QP) sendResponse(env Env, h wire.Headers, psn PSN) {
	h.PKey, h.DestQP, h.PSN, h.MSN = DefaultPKey, q.attr.DestQPN, uint32(psn), q.resp.msn
	buf := env.TxBuffer()
	_, n, err := h.EncodeHeaders(buf, 0)
	if err != nil {
		return
	}
	env.Transmit(n, &q.attr.AV)
	q.ctr.SentPkts.Add(1)
}

// maxDMALen is the largest DMA length a RETH may carry (IBA C9-94).
const maxDMALen = 1 << 31

// ackUnlimited is the ACK syndrome rxe sends: no credit limit.
var ackUnlimited = wire.ACKSyndrome(0x1F)

// handleRequest is the responder for one request packet that passed the
// receive checks. While a READ reply is being sent the request waits
// behind it (readreply.go), and so it does while a FLUSH waits for its
// msync (persist.go).
func (q *QP) handleRequest(env Env, p *wire.Packet, ri *RecvInfo) {
	if q.resp.replying() {
		if q.resp.hold(p.Raw, ri) {
			return
		}
		q.finishReplies(env)
		if !q.responding() {
			return
		}
	}
	if q.resp.persisting() {
		q.holdBehindPersist(p, ri)
		return
	}
	q.processRequest(env, p, ri)
}

// processRequest carries out one request in its turn.
func (q *QP) processRequest(env Env, p *wire.Packet, ri *RecvInfo) {
	r := &q.resp
	psn := PSN(p.BTH.PSN())
	fl := p.Info.Flags
	start := fl&(wire.FlagFirst|wire.FlagOnly) != 0
	switch q.typ {
	case RC:
		d := psn.Diff(r.psn)
		if d > 0 {
			if !r.sentNAK {
				q.ctr.OutOfSeqRequest.Add(1)
				if !r.allowNAK() {
					q.ctr.NAKsLimited.Add(1)
					return
				}
				r.sentNAK = true
				q.sendAck(env, wire.NAKSyndrome(wire.NAKPSNSeqErr), r.psn)
			}
			return
		}
		if d < 0 {
			q.ctr.DuplicateRequest.Add(1)
			q.duplicateRequest(env, p, psn)
			return
		}
		r.sentNAK = false
		r.nakDebt -= min(r.nakDebt, 1)
		r.replayEpoch++ // the requester moves on: replay bounds start anew
	case UC:
		if r.dropMsg || psn != r.psn {
			if !start {
				r.dropMsg = true
				return
			}
			// A new message after a gap: abandon the broken one.
			r.dropMsg = false
			r.opcode = -1
			if r.recvValid {
				r.recvOff = 0
			}
		}
	}
	if q.typ.Connected() && !r.commEst {
		q.commEstablished()
	}
	if !q.checkOpSeq(p.Opcode, start) {
		q.invalidRequest(env, psn, true)
		return
	}
	if !q.checkOpValid(fl) {
		q.invalidRequest(env, psn, false)
		return
	}
	// IBA C9-94 (rxe_resp_check_length): a DMA length above 2^31 is an
	// invalid request, before the rkey is looked at. Taken as it came, a
	// READ of up to 2^32-1 bytes spans up to 2^24 PSNs at MTU 256, the
	// whole PSN space.
	if p.RETH != nil && p.RETH.DMALen() > maxDMALen {
		q.invalidRequest(env, psn, true)
		return
	}
	switch {
	case fl&wire.FlagSend != 0:
		q.executeSend(env, p, ri, psn, start)
	case fl&wire.FlagWrite != 0:
		q.executeWrite(env, p, psn, start)
	case fl&wire.FlagRead != 0:
		q.executeRead(env, p, psn)
	case fl&wire.FlagAtomic != 0:
		q.executeAtomic(env, p, psn)
	case fl&wire.FlagFlush != 0:
		q.executeFlush(env, p, psn)
	case fl&wire.FlagAtomicWrite != 0:
		q.executeAtomicWrite(env, p, psn)
	}
}

// commEstablished raises IB_EVENT_COMM_EST for the first request taken in
// sequence (rdma_rxe raises none; HCAs do, and the ULPs that serve
// rdma_cm connections, such as nvmet-rdma, isert and srpt, pass it to
// rdma_notify so that a lost RTU does not hold the connection up until
// the REP's retransmission). Only a request the responder takes counts:
// its PSN is the expected one (UC: or it starts a message), so a
// duplicate or a stray packet out of sequence does not. rdma_cm's passive
// QP is already in RTS (rdma_accept moves it before the REP), so the
// first request since RTR counts in RTS too.
func (q *QP) commEstablished() {
	q.resp.commEst = true
	if q.onCommEst != nil {
		q.onCommEst(q)
	}
}

// checkOpSeq is rxe's check_op_seq: the packet must continue the message
// in progress, or start a new one.
func (q *QP) checkOpSeq(op wire.Opcode, start bool) bool {
	prev := q.resp.opcode
	low := op & 0x1F
	switch {
	case prev >= 0 && (wire.Opcode(prev)&0x1F == wire.RCSendFirst || wire.Opcode(prev)&0x1F == wire.RCSendMiddle):
		return low == wire.RCSendMiddle || low == wire.RCSendLast || low == wire.RCSendLastImm || op == wire.RCSendLastInv
	case prev >= 0 && (wire.Opcode(prev)&0x1F == wire.RCWriteFirst || wire.Opcode(prev)&0x1F == wire.RCWriteMiddle):
		return low == wire.RCWriteMiddle || low == wire.RCWriteLast || low == wire.RCWriteLastImm
	default:
		return start
	}
}

// checkOpValid is rxe's check_op_valid: the QP's access flags must allow
// the remote operation.
func (q *QP) checkOpValid(fl wire.OpFlags) bool {
	acc := q.attr.AccessFlags
	switch q.typ {
	case RC:
		if fl&wire.FlagRead != 0 && acc&AccessRemoteRead == 0 {
			return false
		}
		if fl&(wire.FlagWrite|wire.FlagAtomicWrite) != 0 && acc&AccessRemoteWrite == 0 {
			return false
		}
		if fl&wire.FlagAtomic != 0 && acc&AccessRemoteAtomic == 0 {
			return false
		}
		if fl&(wire.FlagRead|wire.FlagAtomic|wire.FlagAtomicWrite|wire.FlagFlush) != 0 && q.attr.MaxDestRdAtomic == 0 {
			return false // RESPST_ERR_TOO_MANY_RDMA_ATM_REQ
		}
	case UC:
		if fl&wire.FlagWrite != 0 && acc&AccessRemoteWrite == 0 {
			return false
		}
	}
	return true
}

// nakError is rxe's class A/C error: NAK the request, fail the receive WR
// in progress, and move the QP to ERR.
func (q *QP) nakError(env Env, psn PSN, code uint8, st WCStatus) {
	q.sendAck(env, wire.NAKSyndrome(code), psn)
	q.setState(Err) // before any completion is visible
	if q.resp.recvValid {
		wc := WC{ID: q.resp.recv.ID, Status: st, QPNum: q.num}
		q.rcq.Push(wc)
		q.resp.recvValid = false
	}
	q.enterError()
}

// takeRecv makes sure a receive WR is at hand for a SEND or WRITE_IMM.
func (q *QP) takeRecv() bool {
	r := &q.resp
	if r.recvValid {
		return true
	}
	var ok bool
	if q.srq != nil {
		ok = q.srq.Pop(&r.recv)
	} else {
		ok = q.rq.Pop(&r.recv)
	}
	if ok {
		r.recvValid = true
		r.recvOff = 0
		r.recvLen = int(r.recv.Len())
	}
	return ok
}

// noRecv handles a SEND that found no receive WR: RNR NAK on RC, a
// silent drop on UC/UD.
func (q *QP) noRecv(env Env, psn PSN) {
	if q.typ == RC {
		q.ctr.SendRNRErr.Add(1)
		q.sendAck(env, wire.RNRSyndrome(q.attr.MinRNRTimer), psn)
		return
	}
	if q.typ == UC {
		q.resp.dropMsg = true
	}
}

// finishRequest advances the expected PSN after a request was executed
// and acknowledges it as rxe does.
func (q *QP) finishRequest(env Env, p *wire.Packet, psn PSN, end bool) {
	r := &q.resp
	r.psn = psn.Next()
	r.ackPSN = r.psn
	if end {
		r.opcode = -1
		r.msn = (r.msn + 1) & 0xFFFFFF
	} else {
		r.opcode = int(p.Opcode)
	}
	if q.typ != RC {
		return
	}
	if p.BTH.AckReq() {
		q.sendAck(env, ackUnlimited, psn)
	} else {
		q.ctr.AckDeferred.Add(1)
	}
}

func (q *QP) executeSend(env Env, p *wire.Packet, ri *RecvInfo, psn PSN, start bool) {
	r := &q.resp
	fl := p.Info.Flags
	end := fl&(wire.FlagLast|wire.FlagOnly) != 0
	// Length rules (rxe check_length): FIRST/MIDDLE carry exactly one MTU.
	if (!end && len(p.Payload) != q.mtu) || len(p.Payload) > q.mtu {
		q.invalidRequest(env, psn, false)
		return
	}
	if start || !r.recvValid {
		if !q.takeRecv() {
			q.noRecv(env, psn)
			return
		}
		r.recvOff = 0
		if q.typ.Datagram() {
			if r.recvLen < grhLen {
				q.udRecvError(WCLocLenErr)
				return
			}
			if !q.writeGRH(ri, len(p.Raw)) {
				q.malformedRecv()
				return
			}
		}
	}
	if r.recvOff+len(p.Payload) > r.recvLen {
		q.recvLengthError(env, psn)
		return
	}
	if !q.scatter(r.recv.SGL, p.Payload, r.recvOff) {
		if q.typ == RC {
			q.nakError(env, psn, wire.NAKRemoteOp, WCLocQPOpErr)
		} else {
			q.malformedRecv()
		}
		return
	}
	r.recvOff += len(p.Payload)
	if end {
		wc := WC{ID: r.recv.ID, Status: WCSuccess, Opcode: WCRecv, ByteLen: uint32(r.recvOff),
			QPNum: q.num, Flags: recvWCFlags, Solicited: p.BTH.SE()}
		if p.ImmDt != nil {
			wc.Imm = p.ImmDt.Imm()
			wc.Flags |= WCWithImm
		}
		if p.IETH != nil {
			wc.InvalidatedRKey = p.IETH.RKey()
			wc.Flags |= WCWithInv
			if q.remoteInv != nil {
				if st := q.remoteInv(q, wc.InvalidatedRKey); st != WCSuccess {
					q.invalidateFailed(env, p, psn, wc, st)
					return
				}
			}
		}
		if q.typ.Datagram() {
			wc.SrcQP = p.DETH.SrcQP()
		}
		r.recvValid = false
		q.ctr.RDMARecvs.Add(1)
		if q.rcq.Push(wc) != nil {
			q.cqOverflow()
			return
		}
	}
	q.finishRequest(env, p, psn, end)
}

// invalidateFailed: the rkey of a SEND_WITH_INV could not be invalidated
// (rxe's RESPST_ERR_INVALIDATE_RKEY, "RC - Class J"). As rxe does, the
// receive completes with the error, the SEND is still acknowledged if it
// asked for an ACK (at its PSN, the MSN not advanced: rxe goes through
// do_complete and acknowledge without execute's PSN and MSN update), and
// the QP then enters ERR. The requester's SEND succeeds. The failed
// completion carries wr_id, status and qp_num only, as do_complete fills
// one whose status is not SUCCESS.
func (q *QP) invalidateFailed(env Env, p *wire.Packet, psn PSN, wc WC, st WCStatus) {
	q.resp.recvValid = false
	q.rcq.Push(WC{ID: wc.ID, Status: st, QPNum: wc.QPNum})
	if q.typ == RC && p.BTH.AckReq() {
		q.sendAck(env, ackUnlimited, psn)
	}
	q.enterError()
}

// recvLengthError: the SEND is longer than the receive WR. On UD the
// receive completes with LOC_LEN_ERR and the QP goes on; rxe 6.1 fails it
// as a malformed WQE (copy_data's -EINVAL: LOC_QP_OP_ERR, the QP in
// ERR), a deliberate difference (docs/DESIGN.md).
func (q *QP) recvLengthError(env Env, psn PSN) {
	if q.typ == RC {
		q.nakError(env, psn, wire.NAKInvalidRequest, WCLocLenErr)
		return
	}
	q.udRecvError(WCLocLenErr)
}

// malformedRecv is rxe's RESPST_ERR_MALFORMED_WQE on UC and UD ("All,
// Class A"): the receive WR's own SGL cannot take the data (an lkey that
// names no MR of the QP's PD, a region without local write, an address
// outside it), so the receive completes with LOC_QP_OP_ERR and the QP
// enters ERR, as on RC (nakError, which also NAKs). The application's
// WR is at fault, not the packet: the QP does not go on with it.
func (q *QP) malformedRecv() {
	q.setState(Err) // before any completion is visible
	if q.resp.recvValid {
		q.rcq.Push(WC{ID: q.resp.recv.ID, Status: WCLocQPOpErr, QPNum: q.num})
		q.resp.recvValid = false
	}
	q.enterError()
}

// udRecvError completes the receive WR in progress with st (UC/UD keep
// running; the message is dropped).
func (q *QP) udRecvError(st WCStatus) {
	r := &q.resp
	if r.recvValid {
		wc := WC{ID: r.recv.ID, Status: st, QPNum: q.num}
		q.rcq.Push(wc)
		r.recvValid = false
	}
	if q.typ == UC {
		r.dropMsg = true
		r.opcode = -1
	}
}

func (q *QP) executeWrite(env Env, p *wire.Packet, psn PSN, start bool) {
	r := &q.resp
	fl := p.Info.Flags
	end := fl&(wire.FlagLast|wire.FlagOnly) != 0
	// whole is the first packet's check of the whole target, used for the
	// copy when the packet carries all of it (a one-packet WRITE).
	var whole mr.Region
	defer whole.Release()
	// The packet that consumes a receive (WRITE_ONLY or WRITE_LAST with
	// immediate) needs one before anything else is checked, as rxe's
	// check_resource comes before check_length and check_rkey: no receive
	// is an RNR NAK even for a bad rkey, and a later error completes the
	// receive taken here with its status (nakError).
	if fl&wire.FlagImm != 0 && !q.takeRecv() {
		q.noRecv(env, psn)
		return
	}
	if start {
		r.va, r.rkey, r.length = p.RETH.VA(), p.RETH.RKey(), int(p.RETH.DMALen())
		r.resid = r.length
		if r.resid > 0 {
			// Check the whole target once so a bad WRITE leaves memory
			// untouched (rxe check_rkey on the first packet).
			var err error
			whole, err = q.mem.LookupQP(r.rkey, mr.RKey, q.pd, q.num, r.va, uint64(r.resid), mr.RemoteWrite)
			if err != nil {
				q.rkeyError(env, psn, err)
				return
			}
		}
	}
	n := len(p.Payload)
	// rxe: a packet carries a full MTU while more than one MTU remains,
	// else exactly what remains. And the message may end only there: a
	// LAST or ONLY with more than an MTU to come would end the WRITE
	// short of its DMA length (IBA: an invalid request), which rxe's
	// check_rkey lets through and acknowledges.
	if (r.resid > q.mtu && (n != q.mtu || p.PadCount != 0 || end)) || (r.resid <= q.mtu && (n != r.resid || !end)) {
		q.invalidRequest(env, psn, true)
		return
	}
	if n > 0 {
		if whole.Len() == n {
			copy(whole.Bytes(), p.Payload)
		} else {
			reg, err := q.mem.LookupQP(r.rkey, mr.RKey, q.pd, q.num, r.va, uint64(n), mr.RemoteWrite)
			if err != nil {
				q.rkeyError(env, psn, err)
				return
			}
			copy(reg.Bytes(), p.Payload)
			reg.Release()
		}
		r.va += uint64(n)
		r.resid -= n
	}
	if end && fl&wire.FlagImm != 0 {
		wc := WC{ID: r.recv.ID, Status: WCSuccess, Opcode: WCRecvRDMAWithImm, ByteLen: uint32(r.length),
			QPNum: q.num, Imm: p.ImmDt.Imm(), Flags: recvWCFlags | WCWithImm, Solicited: p.BTH.SE()}
		r.recvValid = false
		if q.rcq.Push(wc) != nil {
			q.cqOverflow()
			return
		}
	}
	q.finishRequest(env, p, psn, end)
}

// cqOverflow is rxe's RESPST_ERR_CQ_OVERFLOW: a completion that cannot be
// delivered must not be acknowledged, so the message is not ACKed and the
// QP moves to ERR.
func (q *QP) cqOverflow() {
	q.enterError()
}

// invalidRequest is rxe's class-C invalid request: NAK and ERR on RC; on
// UC/UD the rest of the message is dropped, and with restart the next
// packet must begin a new message.
func (q *QP) invalidRequest(env Env, psn PSN, restart bool) {
	if q.typ == RC {
		q.nakError(env, psn, wire.NAKInvalidRequest, WCRemInvReqErr)
		return
	}
	q.resp.dropMsg = true
	if restart {
		q.resp.opcode = -1
	}
}

// rkeyError is rxe's RESPST_ERR_RKEY_VIOLATION (class C) or, for a
// misaligned atomic, an invalid request: NAK and ERR on RC; UC drops.
func (q *QP) rkeyError(env Env, psn PSN, err error) {
	if q.typ != RC {
		q.resp.dropMsg = true
		q.resp.opcode = -1
		return
	}
	if mr.RemoteNAK(err) == mr.NAKInvalidRequest {
		q.nakError(env, psn, wire.NAKInvalidRequest, WCRemInvReqErr)
		return
	}
	q.nakError(env, psn, wire.NAKRemoteAccess, WCRemAccessErr)
}

// executeRead accepts a READ: the target is checked once here (rxe
// check_rkey), the MSN counts it (C9-148) and the responses are sent by
// Run from the cursor.
func (q *QP) executeRead(env Env, p *wire.Packet, psn PSN) {
	r := &q.resp
	va, rkey, n := p.RETH.VA(), p.RETH.RKey(), int(p.RETH.DMALen())
	if n > 0 {
		reg, err := q.mem.LookupQP(rkey, mr.RKey, q.pd, q.num, va, uint64(n), mr.RemoteRead)
		if err != nil {
			q.rkeyError(env, psn, err)
			return
		}
		reg.Release()
	}
	npkts := pktCount(n, q.mtu)
	res := r.newResource()
	*res = resource{kind: resRead, firstPSN: psn, lastPSN: psn.Add(uint32(npkts - 1)),
		va: va, length: uint64(n), rkey: rkey}
	r.msn = (r.msn + 1) & 0xFFFFFF // C9-148: a READ counts when it is accepted
	r.reply = readCursor{active: true, opening: true, reqPSN: psn, psn: psn, va: va, resid: n, rkey: rkey}
	r.psn = res.lastPSN.Next()
	r.opcode = -1
}

func (q *QP) executeAtomic(env Env, p *wire.Packet, psn PSN) {
	a := p.AtomicETH
	reg, err := q.mem.LookupQP(a.RKey(), mr.RKey, q.pd, q.num, a.VA(), 8, mr.RemoteAtomic)
	if err != nil {
		q.rkeyError(env, psn, err)
		return
	}
	var orig uint64
	if p.Opcode == wire.RCCompareSwap {
		orig = mr.CompareSwap(reg.Bytes(), a.Compare(), a.SwapAdd())
	} else {
		orig = mr.FetchAdd(reg.Bytes(), a.SwapAdd())
	}
	reg.Release()
	q.acceptSingle(psn, orig)
	q.sendAtomicAck(env, psn, orig)
}

// acceptSingle records an executed atomic, FLUSH or ATOMIC_WRITE (one
// packet at psn, orig the atomic's original value) as a resource for a
// duplicate, counts it in the MSN and expects the next PSN.
func (q *QP) acceptSingle(psn PSN, orig uint64) {
	r := &q.resp
	*r.newResource() = resource{kind: resAtomic, firstPSN: psn, lastPSN: psn, orig: orig}
	r.msn = (r.msn + 1) & 0xFFFFFF
	r.psn = psn.Next()
	r.ackPSN = r.psn
	r.opcode = -1
}

// executeFlush checks the target and accepts the FLUSH. To global
// visibility it is answered at once (the memory is already globally
// visible in this process); to persistence the ACK waits until the
// region's Persist (an msync) returned, which runs off the QP's goroutine
// when the Env can (persist.go).
func (q *QP) executeFlush(env Env, p *wire.Packet, psn PSN) {
	need := mr.FlushGlobal
	if p.FETH != nil && p.FETH.PlacementType()&2 != 0 {
		need = mr.FlushPersistent
	}
	// rxe check_rkey: the rkey is checked whatever the length, and a
	// FLUSH of the whole region (IB_FLUSH_MR) covers all of it,
	// wherever its VA points (process_flush).
	whole := p.FETH != nil && p.FETH.Selectivity() == wire.FlushMR
	reg, err := q.mem.LookupFlushQP(p.RETH.RKey(), q.pd, q.num, p.RETH.VA(), uint64(p.RETH.DMALen()), need, whole)
	if err != nil {
		q.rkeyError(env, psn, err)
		return
	}
	q.acceptSingle(psn, 0)
	if need == mr.FlushPersistent && reg.Len() > 0 {
		q.flushPersist(env, reg, psn) // takes reg over
		return
	}
	reg.Release()
	q.sendAck(env, ackUnlimited, psn)
}

// executeAtomicWrite stores 8 bytes atomically and ACKs.
func (q *QP) executeAtomicWrite(env Env, p *wire.Packet, psn PSN) {
	if len(p.Payload) != 8 {
		q.nakError(env, psn, wire.NAKInvalidRequest, WCRemInvReqErr)
		return
	}
	reg, err := q.mem.LookupQP(p.RETH.RKey(), mr.RKey, q.pd, q.num, p.RETH.VA(), 8, mr.RemoteWrite)
	if err != nil {
		q.rkeyError(env, psn, err)
		return
	}
	// rxe_mr_do_atomic_write: a misaligned target is
	// RESPST_ERR_MISALIGNED_ATOMIC, an invalid request NAK.
	if !reg.Aligned8(p.RETH.VA()) {
		reg.Release()
		q.rkeyError(env, psn, mr.ErrAlign)
		return
	}
	mr.AtomicStore(reg.Bytes(), binary.NativeEndian.Uint64(p.Payload))
	reg.Release()
	q.acceptSingle(psn, 0)
	q.sendAck(env, ackUnlimited, psn)
}

// duplicateRequest answers a request the responder already executed
// (rxe duplicate_request): SEND/WRITE are ACKed again, READs replayed
// from the requested PSN, atomics answered with the saved result.
func (q *QP) duplicateRequest(env Env, p *wire.Packet, psn PSN) {
	fl := p.Info.Flags
	switch {
	case fl&(wire.FlagSend|wire.FlagWrite) != 0:
		// rxe acknowledges at ack_psn-1, the last SEND, WRITE or atomic
		// it executed, never inside a READ: an RC ACK at a READ's last
		// PSN reaches an rxe requester that still waits for that READ's
		// last response as a broken response sequence (check_ack's
		// COMPST_ERROR), and its QP goes to ERR.
		q.sendAck(env, ackUnlimited, q.resp.ackPSN.Prev())
	case fl&wire.FlagRead != 0:
		res := q.resp.findResource(psn)
		if res == nil || res.kind != resRead {
			return
		}
		q.ctr.ResponderResourceHit.Add(1)
		va, rkey, n := p.RETH.VA(), p.RETH.RKey(), uint64(p.RETH.DMALen())
		// rxe: the retry must ask for the READ or a part of it, with the
		// same rkey; anything else is dropped (class D).
		if rkey != res.rkey || va < res.va || n > res.length || va-res.va > res.length-n {
			return
		}
		if !res.allowReplay(psn, n, q.resp.replayEpoch) {
			q.ctr.ReplaysLimited.Add(1)
			return
		}
		// rxe replays from inside a READ as MIDDLE … LAST and only a
		// retry of the whole READ starts with FIRST (or ONLY). The rkey
		// is looked up again when the replay is sent.
		q.resp.reply = readCursor{active: true, opening: psn == res.firstPSN, reqPSN: psn, psn: psn,
			va: va, resid: int(n), rkey: rkey}
	case fl&wire.FlagAtomic != 0:
		res := q.resp.findResource(psn)
		if res == nil || res.kind != resAtomic || res.firstPSN != psn {
			return
		}
		q.ctr.ResponderResourceHit.Add(1)
		q.sendAtomicAck(env, psn, res.orig)
	case fl&(wire.FlagFlush|wire.FlagAtomicWrite) != 0:
		res := q.resp.findResource(psn)
		if res == nil || res.firstPSN != psn {
			return
		}
		q.sendAck(env, ackUnlimited, psn)
	}
}
