package qp

import (
	"encoding/binary"
	"time"

	"github.com/rxed/rxed/pkg/wire"
)

// completer is the response side of the requester (rxe_comp.c): it
// matches ACKs and responses to WQEs and completes them in order.
type completer struct {
	psn          PSN // next response PSN expected
	opcode       int // READ response opcode in progress, -1 none
	retryCnt     uint8
	refills      uint8 // retryCnt refilled without progress (handleResponse)
	rnrRetry     uint8
	startedRetry bool
	timeoutRetry bool
	// readHold: the oldest READ is being asked for again after a gap in
	// its reply; the WQEs after it wait, and later READ replies that
	// arrive whole are kept (readkeep.go).
	readHold bool
	keep     readKeep
}

// completeWQE retires the WQE at head, posting a completion when it is
// signalled, failed, or force is set.
func (q *QP) completeWQE(w *wqe, force bool) {
	if w.hasRdAtomic {
		w.hasRdAtomic = false
		q.req.rdAtomic--
	}
	signal := force || q.sigAll || w.wr.Flags&Signaled != 0 || w.status != WCSuccess
	var wc WC
	if signal {
		wc = WC{ID: w.wr.ID, Status: w.status, QPNum: q.num}
		// A failed or flushed WR's completion carries no opcode, length
		// or flags: rxe's make_send_cqe fills them only on success (since
		// Linux 5.16), and ibv_poll_cq(3) calls them invalid otherwise.
		if w.status == WCSuccess {
			wc.Opcode, _ = w.wr.Opcode.WCOpcode()
			wc.ByteLen = uint32(w.length)
			if w.wr.Opcode.HasImm() {
				wc.Flags |= WCWithImm
			}
		}
	}
	// Free the slot before the completion becomes visible (as a polled
	// CQE frees its WQE in libibverbs): an application that posts the
	// moment it polls must find room. w may be reused from here on.
	q.sq.retire()
	if q.req.idx < q.sq.head {
		q.req.idx = q.sq.head
	}
	if signal {
		q.scq.Push(wc)
	}
	// After the completion is visible: an application woken by the
	// SQ-drained event finds every completion of the drain in its CQ.
	q.checkSQDrained()
	q.afterRetire()
}

// completeDone retires, in order, WQEs that need no response; a failed
// one moves the QP to ERR.
func (q *QP) completeDone() {
	for q.sq.head != q.req.idx {
		w := q.sq.at(q.sq.head)
		switch w.state {
		case wqeDone:
			q.completeWQE(w, false)
		case wqeError:
			q.enterError()
			return
		default:
			return
		}
	}
}

// headWQE returns the oldest WQE that is waiting for a response, after
// retiring finished ones; nil if there is none.
func (q *QP) headWQE() *wqe {
	q.completeDone()
	if q.sq.head == q.req.idx && (q.sq.head == q.sq.published() || q.sq.at(q.sq.head).sent == 0) {
		return nil
	}
	if q.attr.State == Err {
		return nil
	}
	return q.sq.at(q.sq.head)
}

func (q *QP) resetRetry() {
	q.comp.retryCnt = q.attr.RetryCnt
	q.comp.rnrRetry = q.attr.RNRRetry
	q.comp.startedRetry = false
	q.comp.refills = 0
}

// rearm restarts the retransmit timer after progress, or stops it when
// nothing is outstanding or an RNR NAK is being waited out (the resend
// after the wait arms it again: sendNext).
func (q *QP) rearm(now time.Time) {
	if q.timeout > 0 && q.attr.State != Err && q.req.psn != q.comp.psn && q.rnrAt.IsZero() {
		q.retransmitAt = now.Add(q.timeout)
	} else {
		q.retransmitAt = time.Time{}
	}
}

// afterResponse runs when handleResponse is done with a response that
// found comp.psn at before: the fast retransmit's bookkeeping
// (noteProgress), then the local ACK timer follows the outstanding work.
// Progress restarts it, and with nothing outstanding it stops, whichever
// step consumed the response: a coalesced ACK that completes the last
// WQE sent (the requester gone back and not yet resent the next) returns
// from handleResponse's loop before any rearm, and the stale deadline
// left armed would have timed out the next request early (sendNext arms
// only an idle timer), spending a retry and resending
// (TestCoalescedAckLeavesNoStaleLocalACKTimer). Two compares per
// response.
func (q *QP) afterResponse(before PSN, now time.Time) {
	q.noteProgress(before, now) // may go back to comp.psn
	if q.comp.psn != before || q.req.psn == q.comp.psn {
		q.rearm(now)
	}
}

// The response to the oldest WQE passes through the steps of rxe's
// completer (rxe_comp.c), one function each: handleResponse is GET_ACK
// and GET_WQE (headWQE), checkPSN is CHECK_PSN (whether the response
// concerns the oldest WQE at all, or completes it as a coalesced ACK:
// completeCoalesced); checkAck is CHECK_ACK, which hands the response
// to READ (completeReadResponse), ATOMIC (completeAtomicAck) or, for an
// ACK or NAK, to the syndrome's step (completeAck: WRITE_SEND,
// RNR_RETRY, ERROR_RETRY or ERROR). A step that consumes its response
// moves comp.psn past it and completes the WQE when it is whole
// (UPDATE_COMP and COMP_WQE); one that rejects it returns without
// touching anything, and the requester's retry or timer recovers.

// handleResponse processes an ACK, NAK, READ response or atomic ACK.
func (q *QP) handleResponse(env Env, p *wire.Packet, now time.Time) {
	if q.typ != RC {
		return
	}
	psn := PSN(p.BTH.PSN())
	// A response for a PSN no request has used yet is a ghost (IBA
	// 9.9.1: responses outside the outstanding window are ignored): taken
	// as a coalesced ACK it would complete work the responder never saw.
	if psn.Diff(q.req.sentEnd) >= 0 {
		q.ctr.GhostResponses.Add(1)
		return
	}
	// retry_cnt bounds retries while the responder is silent. Any response
	// inside the outstanding window proves it is alive and answering, even
	// one that only tells us (implied NAK) that an earlier response was
	// lost, so it refills the counter. rxe refills it only on responses
	// that complete or advance the oldest WQE; under heavy loss that
	// fails live connections after seven unlucky rounds in a row. But a
	// responder that answers every retry with the same gap (a path that
	// drops full-sized packets passes only a READ's short last response)
	// would keep the requester retrying for ever: without progress
	// (resetRetry) the counter is refilled retry_cnt times at most, so
	// such a stall still ends in RETRY_EXC_ERR. An RNR NAK refills
	// nothing, as in rxe (check_ack's AETH_RNR_NAK counts rcvd_rnr_err
	// and COMPST_RNR_RETRY spends rnr_retry, neither touches retry_cnt):
	// the wait it asks for is rnr_retry's to bound, and a timeout after
	// it must still count the retries spent before it
	// (TestRNRNakRefillsNoRetryCnt).
	if psn.InRange(q.comp.psn, q.req.psn) && q.comp.retryCnt < q.attr.RetryCnt &&
		q.comp.refills < q.attr.RetryCnt && !isRNRNAK(p) {
		q.comp.retryCnt = q.attr.RetryCnt
		q.comp.refills++
	}
	defer q.afterResponse(q.comp.psn, now)
	for {
		w := q.headWQE()
		if w == nil {
			// The oldest READ, gone back to its start, may be waiting
			// to be asked for again: later replies may still be kept.
			q.keepLaterRead(p, psn)
			return
		}
		switch q.checkPSN(w, psn) {
		case psnCoalescedAck:
			q.completeCoalesced(w)
			continue // the response may acknowledge the next WQE too
		case psnImpliedNAK:
			q.ctr.ImpliedNAKs.Add(1)
			if w.wr.Opcode == WRRDMARead {
				q.comp.readHold = true
			}
			q.errorRetry(w, now)
			q.keepLaterRead(p, psn)
			return
		case psnReadGap:
			if !q.comp.startedRetry { // counted once per gap, as it is retried
				q.ctr.ReadResponseGaps.Add(1)
			}
			q.comp.readHold = true
			q.errorRetry(w, now)
			return
		case psnIgnore:
			return
		}
		q.checkAck(p, w, psn, now)
		q.rearm(now)
		q.completeDone()
		return
	}
}

// isRNRNAK reports whether p is an ACK packet with an RNR NAK syndrome.
func isRNRNAK(p *wire.Packet) bool {
	return p.Opcode == wire.RCAck && p.AETH != nil && p.AETH.Syndrome().Kind() == wire.SynRNR
}

// psnVerdict is what checkPSN makes of a response's PSN.
type psnVerdict uint8

const (
	psnCheckAck     psnVerdict = iota // at the expected PSN: checkAck consumes it
	psnCoalescedAck                   // past the oldest WQE, a SEND/WRITE: that one is acknowledged
	psnImpliedNAK                     // past a READ or atomic whose responses never came
	psnIgnore                         // old, duplicated, or ahead inside an atomic
	psnReadGap                        // ahead inside the oldest READ: a response before it was lost
)

// checkPSN is rxe's COMPST_CHECK_PSN: where the response's PSN lies
// relative to the oldest WQE w and the next expected response PSN.
func (q *QP) checkPSN(w *wqe, psn PSN) psnVerdict {
	// A response past the oldest WQE acknowledges it (coalesced ACK),
	// unless it is a READ or atomic whose response never came: that is an
	// implied NAK and the requester goes back. A SEND/WRITE being resent
	// after a go-back counts as sent: the peer has it all.
	if (w.state == wqePending || w.sent > 0) && psn.Diff(w.lastPSN) > 0 {
		if w.isReadOrAtomic() {
			return psnImpliedNAK
		}
		return psnCoalescedAck
	}
	d := psn.Diff(q.comp.psn)
	if d < 0 {
		return psnIgnore // an old or duplicated response
	}
	if d > 0 && w.wr.Opcode == WRRDMARead {
		// READ responses arrive in order, so one past the expected PSN
		// inside this READ means the ones between were lost. rxe waits
		// for its timer here (check_psn's COMPST_DONE). Re-requesting
		// from the missing PSN at once is the same retry, only sooner
		// (recovery.go): the responder answers a READ retried from its
		// middle as it answers a duplicate, and errorRetry allows one
		// go-back per gap until progress, so the rest of the same reply,
		// still arriving, does not rewind again.
		return psnReadGap
	}
	if d > 0 && w.isReadOrAtomic() {
		return psnIgnore // an atomic's response must be the expected PSN
	}
	return psnCheckAck
}

// completeCoalesced is rxe's COMPST_COMP_ACK for a WQE a later response
// acknowledged: the responder sends one ACK for several requests, so the
// SEND/WRITE behind it completes without an ACK of its own.
func (q *QP) completeCoalesced(w *wqe) {
	q.resetRetry()
	if w.lastPSN.Diff(q.comp.psn) >= 0 {
		q.comp.psn = w.lastPSN.Next()
		q.comp.opcode = -1
	}
	q.completeWQE(w, false)
}

// checkAck is rxe's check_ack for one response whose PSN is the expected
// one (or inside the oldest SEND/WRITE): it must fit the READ response
// sequence in progress, then its opcode picks the step that consumes it.
func (q *QP) checkAck(p *wire.Packet, w *wqe, psn PSN, now time.Time) {
	if !q.continuesReadSequence(p, w, psn) {
		return
	}
	switch p.Opcode {
	case wire.RCReadResponseFirst, wire.RCReadResponseMiddle, wire.RCReadResponseLast, wire.RCReadResponseOnly:
		q.completeReadResponse(p, w, psn)
	case wire.RCAtomicAck:
		q.completeAtomicAck(p, w, psn)
	case wire.RCAck:
		q.completeAck(p, w, psn, now)
	}
}

// continuesReadSequence is check_ack's opcode check. While a READ's
// responses are arriving (comp.opcode FIRST or MIDDLE) only a MIDDLE or
// LAST continues them, or a FIRST or ONLY at the READ's first PSN: the
// responder answers a READ retried from its start with a whole new reply.
// With no reply in progress a response must open a message (FIRST or
// ONLY; an ACK or atomic ACK is an ONLY): a stray MIDDLE or LAST belongs
// to a reply whose start was lost, and waits for the retry.
func (q *QP) continuesReadSequence(p *wire.Packet, w *wqe, psn PSN) bool {
	switch q.comp.opcode {
	case -1:
		return p.Info.Flags&(wire.FlagFirst|wire.FlagOnly) != 0
	case int(wire.RCReadResponseFirst), int(wire.RCReadResponseMiddle):
		switch p.Opcode {
		case wire.RCReadResponseMiddle, wire.RCReadResponseLast:
			return true
		case wire.RCReadResponseFirst, wire.RCReadResponseOnly:
			return psn == w.firstPSN
		}
		return false
	}
	return true
}

// completeReadResponse is rxe's COMPST_READ: place the response's bytes
// where the READ's SGEs say, at the offset reached so far, and complete
// the READ with its last response once every byte has arrived. A
// response carrying a NAK syndrome, or one for a WQE that is not a READ,
// is ignored: the responder is answering something else and the retry
// sorts it out. Bytes beyond the READ's length or outside its local
// memory fail it (LOC_LEN_ERR, LOC_PROT_ERR), as a receive would.
func (q *QP) completeReadResponse(p *wire.Packet, w *wqe, psn PSN) {
	if p.AETH != nil && p.AETH.Syndrome().Kind() != wire.SynACK {
		return
	}
	if w.wr.Opcode != WRRDMARead {
		return
	}
	q.resetRetry()
	if len(p.Payload) > w.length-w.recvd {
		w.status = WCLocLenErr
		q.failWQE(w)
		return
	}
	if !q.scatter(w.sgl, p.Payload, w.recvd) {
		w.status = WCLocProtErr
		q.failWQE(w)
		return
	}
	w.recvd += len(p.Payload)
	q.comp.psn = psn.Next()
	if p.Info.Flags&(wire.FlagLast|wire.FlagOnly) == 0 {
		q.comp.opcode = int(p.Opcode) // more responses of this READ follow
		return
	}
	q.comp.opcode = -1
	if w.recvd == w.length {
		q.completeWQE(w, false)
	}
}

// completeAtomicAck is rxe's COMPST_ATOMIC: the original value the
// responder read is the atomic's result, written into its local buffer.
// An atomic ACK with a NAK syndrome or for a WQE that is not an atomic is
// ignored, as a stray READ response is.
func (q *QP) completeAtomicAck(p *wire.Packet, w *wqe, psn PSN) {
	if p.AETH.Syndrome().Kind() != wire.SynACK || !w.wr.Opcode.IsAtomic() {
		return
	}
	q.resetRetry()
	var orig [8]byte
	// rxe copies the 64-bit value in host order into the local buffer.
	binary.NativeEndian.PutUint64(orig[:], p.AtomicAckETH.OrigData())
	if !q.scatter(w.sgl, orig[:], 0) {
		w.status = WCLocProtErr
		q.failWQE(w)
		return
	}
	q.comp.psn = psn.Next()
	q.comp.opcode = -1
	q.completeWQE(w, false)
}

// completeAck is check_ack's AETH test for an ACK packet: the syndrome
// says whether the requests up to psn arrived (ACK), the responder had no
// receive WQE (RNR NAK), a request went missing (PSN sequence error NAK)
// or failed for good (any other NAK).
func (q *QP) completeAck(p *wire.Packet, w *wqe, psn PSN, now time.Time) {
	syn := p.AETH.Syndrome()
	switch syn.Kind() {
	case wire.SynACK:
		q.ackWriteSend(w, psn)
	case wire.SynRNR:
		q.rnrRetry(w, syn, now)
	case wire.SynNAK:
		if syn.NAKCode() == wire.NAKPSNSeqErr {
			q.nakSequenceError(psn, now)
			return
		}
		w.status = nakStatus(syn.NAKCode())
		q.failWQE(w)
	default:
		// A reserved syndrome: the responder is broken (IBA 9.7.5.1.6).
		w.status = WCBadRespErr
		q.failWQE(w)
	}
}

// ackWriteSend is rxe's COMPST_WRITE_SEND: an ACK at psn acknowledges the
// requests up to it, and completes the oldest WQE when psn is its last.
// Only a SEND, WRITE, FLUSH or ATOMIC_WRITE is completed by an ACK; a
// READ or atomic awaits its own responses. An ACK from inside the WQE
// while a go-back-N resends it says the peer already holds more than is
// being resent: the requester skips ahead to comp.psn.
func (q *QP) ackWriteSend(w *wqe, psn PSN) {
	q.resetRetry()
	if w.isReadOrAtomic() && w.wr.Opcode != WRFlush && w.wr.Opcode != WRAtomicWrite {
		return
	}
	q.comp.psn = psn.Next()
	q.comp.opcode = -1
	if w.lastPSN == psn {
		q.completeWQE(w, false)
	} else if q.req.psn.Diff(q.comp.psn) < 0 {
		q.goBackN()
	}
}

// rnrRetry is rxe's COMPST_RNR_RETRY: the responder had no receive WQE.
// The requester pauses for the NAK's RNR timer (OnTimer then resends
// from comp.psn), while rnr_retry lasts; 7 means retry forever. The
// retransmit timers stop meanwhile (rearm and noteProgress leave them
// off while rnrAt is set): waiting for the peer to post a receive is not
// a lost packet. (rxe's COMPST_RNR_RETRY leaves its retransmit timer
// pending, so an expiry during the wait goes to COMPST_ERROR_RETRY.)
func (q *QP) rnrRetry(w *wqe, syn wire.Syndrome, now time.Time) {
	q.ctr.RcvdRNRErr.Add(1)
	if q.comp.rnrRetry > 0 {
		if q.comp.rnrRetry != 7 {
			q.comp.rnrRetry--
		}
		q.rnrAt = now.Add(RNRDelay(syn.RNRTimer()))
		q.retransmitAt, q.rec.rtoAt = time.Time{}, time.Time{}
		return
	}
	q.ctr.RetryRNRExceededErr.Add(1)
	w.status = WCRNRRetryExcErr
	q.failWQE(w)
}

// nakSequenceError is rxe's COMPST_ERROR_RETRY for a PSN sequence error
// NAK: the responder expects psn, so the requests before it arrived and
// those from it on are to be resent.
func (q *QP) nakSequenceError(psn PSN, now time.Time) {
	if !q.rnrAt.IsZero() {
		// The packets behind an RNR-NAKed one arrive out of sequence; the
		// RNR retry resends them anyway.
		return
	}
	if psn.Diff(q.comp.psn) > 0 {
		q.ctr.RcvdSeqErr.Add(1)
		q.implicitAck(psn)
		// The NAK acknowledges the requests before psn, but not the
		// responses of a READ or atomic among them: never move past one
		// that is still unanswered, so the retry asks for its data again.
		if h := q.headWQE(); h == nil || !h.isReadOrAtomic() || h.state != wqePending {
			q.comp.psn = psn
			// The NAK acknowledged new packets: that is progress, so this
			// gap gets its own retry rather than waiting for the timer
			// behind the previous one.
			q.comp.startedRetry = false
		}
	}
	if w := q.headWQE(); w != nil {
		q.errorRetry(w, now)
	}
}

// nakStatus is the completion status of a WQE the responder NAKed for
// good (rxe's COMPST_ERROR): the request was invalid, broke the remote
// access rules, or failed at the responder for another reason.
func nakStatus(code uint8) WCStatus {
	switch code {
	case wire.NAKInvalidRequest:
		return WCRemInvReqErr
	case wire.NAKRemoteAccess:
		return WCRemAccessErr
	default:
		return WCRemOpErr
	}
}

// implicitAck completes the SEND/WRITE WQEs a NAK at psn acknowledges:
// those that end before it.
func (q *QP) implicitAck(psn PSN) {
	for {
		w := q.headWQE()
		if w == nil || w.state != wqePending || w.isReadOrAtomic() || w.lastPSN.Diff(psn) >= 0 {
			return
		}
		q.completeWQE(w, false)
	}
}

// failWQE completes w with its error status and moves the QP to ERR.
func (q *QP) failWQE(w *wqe) {
	// enterError flushes from the head, where w is: w completes first
	// with its own status, the rest with WR_FLUSH_ERR, and the QP is
	// already in ERR when the first completion becomes visible.
	w.state = wqeError
	q.enterError()
}

// errorRetry is rxe's COMPST_ERROR_RETRY: go back to the oldest
// unacknowledged PSN, or fail once retry_cnt is used up.
func (q *QP) errorRetry(w *wqe, now time.Time) {
	timeout := q.comp.timeoutRetry
	q.comp.timeoutRetry = false
	if !timeout {
		q.rec.lossAt = now // the responder told of a loss (LossRecent)
	}
	if q.comp.startedRetry && !timeout {
		return // one retry per loss until progress or a timeout
	}
	if q.req.psn.Diff(q.comp.psn) <= 0 && w.state != wqePending {
		// Nothing to retry (rxe_comp.c: "there is nothing to retry in
		// this case"): the requester has gone back to the oldest
		// unacknowledged PSN and not sent again yet. A response behind
		// a gap that is handled before the QP runs again (the engine
		// runs a QP once per received batch) asks for the go-back under
		// way; it must not spend retry_cnt, or a batch with a few such
		// responses fails a live READ with RETRY_EXC_ERR
		// (TestRetryCountNotSpentWithoutARetry).
		q.rearm(now)
		return
	}
	if q.comp.retryCnt > 0 {
		q.comp.retryCnt--
		q.ctr.CompleterRetryErr.Add(1)
		q.noteLoss()
		q.goBackN()
		q.comp.startedRetry = true
		q.rearm(now)
		q.restartFastTimer(now)
		return
	}
	q.ctr.RetryExceededErr.Add(1)
	w.status = WCRetryExcErr
	q.failWQE(w)
}

// goBackN is rxe's req_retry: restart sending at the oldest
// unacknowledged PSN, resuming a partly acknowledged SEND/WRITE at the
// right packet and a partly answered READ at the right offset.
func (q *QP) goBackN() {
	tail := q.sq.published()
	q.req.idx = q.sq.head
	q.req.psn = q.comp.psn
	q.req.noack = 0
	q.comp.opcode = -1
	first := true
	for i := q.sq.head; i != tail; i++ {
		w := q.sq.at(i)
		if w.kept {
			continue // its reply is in (readkeep.go)
		}
		if w.state == wqePosted && w.sent == 0 {
			break
		}
		if w.state == wqeDone || w.state == wqeError {
			continue
		}
		if first {
			first = false
			switch {
			case w.wr.Opcode == WRRDMARead:
				w.sent = w.recvd
				if w.recvd > 0 {
					// The responder (rxe duplicate_request) replays a
					// READ retried from inside as MIDDLE … LAST: the
					// READ response sequence continues, as rxe's
					// comp.opcode survives req_retry.
					q.comp.opcode = int(wire.RCReadResponseMiddle)
				}
			case w.isReadOrAtomic():
				w.sent = 0
			default:
				if n := int(q.comp.psn.Diff(w.firstPSN)); n > 0 {
					w.sent = min(n*q.mtu, w.length)
				} else {
					w.sent = 0
				}
			}
		} else {
			w.sent = 0
			w.recvd = 0
		}
		w.state = wqePosted
	}
}

// OnTimer handles expired retransmit and RNR timers, then lets the
// requester send.
func (q *QP) OnTimer(env Env, now time.Time, budget int) (more bool) {
	if !q.rnrAt.IsZero() && !now.Before(q.rnrAt) {
		q.rnrAt = time.Time{}
		if q.attr.State != Err {
			q.goBackN()
			q.rearm(now)
		}
	}
	if !q.rec.rtoAt.IsZero() && !now.Before(q.rec.rtoAt) {
		if !q.retransmitAt.IsZero() && !now.Before(q.retransmitAt) {
			// Both expired: IBA's timer goes first (below) and spends a
			// retry; a fast retransmit before it would rewind the WQE,
			// leaving the timeout nothing to count.
			q.rec.rtoAt = time.Time{}
		} else {
			q.onFastRetransmit(now)
		}
	}
	if !q.retransmitAt.IsZero() && !now.Before(q.retransmitAt) {
		q.retransmitAt = time.Time{}
		if w := q.headWQE(); w != nil && q.rnrAt.IsZero() {
			q.ctr.RetransmitTimeouts.Add(1)
			q.comp.timeoutRetry = true
			q.errorRetry(w, now)
		}
	}
	return q.Run(env, now, budget)
}
