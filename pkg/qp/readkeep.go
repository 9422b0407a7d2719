package qp

import "github.com/rxed/rxed/pkg/wire"

// Keeping the READ replies that arrive behind a gap.
//
// When a response of the oldest READ is lost, go-back-N (rxe's
// req_retry) asks again for that READ from the missing PSN and for every
// READ after it, and the completer drops every response until the
// missing one comes again. But the responder has already executed the
// later READs and is still sending their replies, which arrive intact
// and were thrown away, only to be asked for and sent a second time: at
// 1% loss `rxed perf read` received two response packets for each one it
// used (63,748 for 32,000; 98 per gap). The requester owns those bytes'
// destination, so nothing forbids placing them.
//
// So after a gap in the oldest READ (readHold) the requester asks again
// only for that READ, and holds the WQEs after it; the completer places
// the reply of a later READ that arrives whole and in order, FIRST (or
// ONLY) at that READ's first PSN to LAST, as it would its own, and marks
// the WQE kept. A reply broken by another loss is dropped (that READ is
// asked for again in full). When the oldest READ completes, its replay
// came after everything the responder had queued before it (responders
// answer in order), so the hold ends: the kept WQEs at the head retire
// at once, in order, and the requester resumes go-back-N from the first
// WQE that is not kept, stepping over the PSNs of any kept one further
// on (nothing asks for a kept READ again). Nothing changes on the wire
// but what is not sent: every request still has the PSN go-back-N would
// give it, and the responder answers a READ it already executed as the
// duplicate it is (IBA 9.7.5.1.3; rxe's duplicate_request).

// readKeep follows the reply of one later READ being kept.
type readKeep struct {
	active bool
	idx    uint64 // the WQE's send queue index
	next   PSN    // the next response PSN of its reply
	recvd  int    // bytes placed so far
}

// keepLaterRead is offered a response that lies past the oldest WQE:
// while that is a READ waiting for a retry (readHold), it places the
// response if it continues (or opens) the whole, in-order reply of a
// later READ.
func (q *QP) keepLaterRead(p *wire.Packet, psn PSN) {
	if !q.comp.readHold || q.attr.State == Err {
		return
	}
	k := &q.comp.keep
	if p.AETH != nil && p.AETH.Syndrome().Kind() != wire.SynACK {
		q.dropKeep()
		return
	}
	switch p.Opcode {
	case wire.RCReadResponseMiddle, wire.RCReadResponseLast:
		if !k.active || psn != k.next {
			q.dropKeep() // a loss inside this reply: it is asked for again
			return
		}
	case wire.RCReadResponseFirst, wire.RCReadResponseOnly:
		q.dropKeep()
		i, ok := q.laterReadAt(psn)
		if !ok {
			return
		}
		*k = readKeep{active: true, idx: i, next: psn}
	default:
		q.dropKeep()
		return
	}
	w := q.sq.at(k.idx)
	if len(p.Payload) > w.length-k.recvd || !q.scatter(w.sgl, p.Payload, k.recvd) {
		// Not what this READ asked for: the retry sorts it out (and a
		// real length or protection error shows there).
		q.dropKeep()
		return
	}
	k.recvd += len(p.Payload)
	k.next = psn.Next()
	if p.Info.Flags&(wire.FlagLast|wire.FlagOnly) == 0 {
		return
	}
	if k.recvd != w.length || k.next != w.lastPSN.Next() {
		q.dropKeep()
		return
	}
	k.active = false
	w.recvd, w.kept, w.state = w.length, true, wqePending
	q.ctr.ReadRepliesKept.Add(1)
}

// laterReadAt finds the READ after the oldest WQE whose first response
// PSN is psn, among the WQEs already started (whose PSNs are theirs).
func (q *QP) laterReadAt(psn PSN) (uint64, bool) {
	for i := q.sq.head + 1; i < q.req.startedEnd && i < q.sq.published(); i++ {
		w := q.sq.at(i)
		if w.wr.Opcode == WRRDMARead && !w.kept && w.state == wqePosted && w.firstPSN == psn {
			return i, true
		}
	}
	return 0, false
}

// dropKeep abandons the reply being kept: its READ is asked for again.
func (q *QP) dropKeep() {
	if k := &q.comp.keep; k.active {
		k.active = false
		if k.idx >= q.sq.head && k.idx < q.sq.published() { // not retired meanwhile (a flush)
			q.sq.at(k.idx).recvd = 0
		}
	}
}

// afterRetire runs when the oldest WQE has retired: a hold ends (and the
// requester resumes from the first WQE that is not kept), and a kept WQE
// now at the head retires (its completion retires the next kept one). In
// ERR the flush completes every WQE, the kept ones with WR_FLUSH_ERR too.
func (q *QP) afterRetire() {
	hold := q.comp.readHold
	if hold {
		q.comp.readHold = false
		q.dropKeep()
	}
	if q.attr.State == Err {
		return
	}
	if q.sq.head != q.sq.published() {
		if w := q.sq.at(q.sq.head); w.kept {
			w.kept, w.state = false, wqeDone
			q.comp.psn = w.lastPSN.Next()
			q.completeWQE(w, false)
		}
	}
	if hold && q.req.idx == q.sq.head && !q.midMessage() {
		q.req.psn = q.comp.psn
	}
}

// midMessage reports that the SEND or WRITE at req.idx has sent some of
// its packets and not all: req.psn is then the PSN of its next packet, and resuming
// at comp.psn would send that packet under an earlier PSN (a hold that
// began after a go-back-N had already resent the start of the message).
func (q *QP) midMessage() bool {
	if q.req.idx == q.sq.published() {
		return false
	}
	w := q.sq.at(q.req.idx)
	return w.state == wqePosted && w.sent > 0 && !w.isReadOrAtomic()
}
