package qp

import (
	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/wire"
)

// A READ is answered a budget at a time, as rxe's responder sends one
// response per loop of its task and reschedules (read_reply returning
// RESPST_DONE while res->read.resid > 0): a 16 MiB READ must neither
// flood the peer's socket buffer with 4096 packets in one go nor hold up
// every other QP of the worker. Receive only accepts the READ and points
// the cursor at it; Run sends the responses, budget packets per call, and
// reports more work until the last one is out.
//
// Requests arriving meanwhile wait in order behind the reply, as they
// wait in rxe's req_pkts queue while qp->resp.res is set: responses then
// leave in PSN order, a duplicate READ replays only after the reply in
// progress is complete (so two cursors never send the same resource's
// packets interleaved), and an atomic is executed only after the READ
// before it has read the memory.
//
// Memory: nothing is held between packets. Each response looks the rkey
// up again for its own bytes and releases the region once it is sent (or
// copied), as rxe re-checks the rkey for every packet after the first
// (rxe_recheck_mr). A region deregistered or invalidated mid-reply thus
// ends the reply with a remote access NAK and moves the QP to ERR, as in
// rxe; a paused reply never pins a region (or a file mapping under it);
// and a QP leaving RTR/RTS/SQD (ERR, RESET) simply forgets the cursor.

// readCursor is where the READ reply in progress stands (rxe's
// qp->resp.res with its res->read fields and cur_psn).
type readCursor struct {
	active bool
	// opening: the next packet is the reply's first, FIRST or ONLY (rxe's
	// rdatm_res_state_new: a new READ or a replay of a whole one); a
	// replay from inside a READ starts with MIDDLE or LAST.
	opening bool
	reqPSN  PSN    // PSN of the request answered, for a NAK
	psn     PSN    // PSN of the next response (res->cur_psn)
	va      uint64 // its first byte (res->read.va)
	resid   int    // bytes still to send (res->read.resid)
	rkey    uint32
}

// heldRequestLen bounds the requests kept while a reply is in progress:
// every READ, atomic, FLUSH and ATOMIC_WRITE request (and small SENDs)
// fits; a longer packet makes the reply finish at once instead.
const heldRequestLen = 64

// heldRequests is how many requests may wait behind a reply. A peer keeps
// at most max_rd_atomic READs and atomics outstanding, and stops sending
// other requests 128 PSNs ahead of its oldest unacknowledged one; when
// more still arrive the reply is finished at once and they are handled
// without waiting.
const heldRequests = 16

// heldRequest is a copy of a request that arrived during a reply.
type heldRequest struct {
	n   int
	raw [heldRequestLen]byte
	ri  RecvInfo
}

// replying reports whether a READ reply is being sent or requests wait
// behind one. Requests held behind a FLUSH waiting for its msync are not
// Run's work until PersistDone (persist.go).
func (r *responder) replying() bool {
	return r.reply.active || (r.heldLen > 0 && !r.persisting())
}

// hold queues a copy of the request packet raw; false when it is too long
// or the queue is full.
func (r *responder) hold(raw []byte, ri *RecvInfo) bool {
	if len(raw) > heldRequestLen {
		return false
	}
	if r.held == nil {
		r.held = make([]heldRequest, heldRequests)
	}
	if r.heldLen == len(r.held) {
		return false
	}
	h := &r.held[(r.heldHead+r.heldLen)%len(r.held)]
	h.n = copy(h.raw[:], raw)
	h.ri = RecvInfo{}
	if ri != nil {
		h.ri = *ri
	}
	r.heldLen++
	return true
}

// popHeld removes the oldest held request. Its slot stays intact until
// the next hold, which cannot happen while it is being processed.
func (r *responder) popHeld() *heldRequest {
	if r.heldLen == 0 {
		return nil
	}
	h := &r.held[r.heldHead]
	r.heldHead = (r.heldHead + 1) % len(r.held)
	r.heldLen--
	return h
}

// dropReplies forgets the reply in progress and the requests behind it.
func (r *responder) dropReplies() {
	r.reply = readCursor{}
	r.heldHead, r.heldLen = 0, 0
}

// responding reports whether the QP's state lets the responder answer
// (the states in which Check accepts requests).
func (q *QP) responding() bool {
	switch q.attr.State {
	case RTR, RTS, SQD:
		return true
	}
	return false
}

// runResponder sends up to budget packets of READ responses and of the
// answers to requests held behind them, and returns the budget left. Run
// calls it first, so a reply is never starved by the requester.
func (q *QP) runResponder(env Env, budget int) int {
	r := &q.resp
	if !r.replying() {
		return budget
	}
	if !q.responding() {
		r.dropReplies()
		return budget
	}
	for budget > 0 {
		if r.reply.active {
			budget = q.sendReadReply(env, budget)
		} else if r.persisting() {
			break // a held FLUSH went off to its msync; the rest waits
		} else if h := r.popHeld(); h != nil {
			p := &r.heldPkt
			if p.Parse(h.raw[:h.n]) != nil {
				continue // it parsed when it arrived; cannot happen
			}
			q.processRequest(env, p, &h.ri)
			if !r.reply.active {
				budget-- // an ACK, NAK or atomic ACK at most
			}
		} else {
			break
		}
		if !q.responding() {
			r.dropReplies()
			break
		}
	}
	return budget
}

// finishReplies sends everything the responder owes before it handles a
// request that cannot wait in the queue, ignoring the budget (what the
// responder did before replies were paced).
func (q *QP) finishReplies(env Env) {
	for q.resp.replying() && q.responding() {
		q.runResponder(env, 1<<30)
	}
}

// sendReadReply sends up to budget responses of the READ reply in
// progress and returns the budget left.
func (q *QP) sendReadReply(env Env, budget int) int {
	c := &q.resp.reply
	pe, inPlace := env.(PayloadEnv)
	for budget > 0 && c.active {
		n := min(c.resid, q.mtu)
		last := c.resid <= q.mtu
		// rxe_recheck_mr: the rkey is looked up again for every packet; a
		// failure is RESPST_ERR_RKEY_VIOLATION, class C.
		reg, err := q.mem.LookupQP(c.rkey, mr.RKey, q.pd, q.num, c.va, uint64(n), mr.RemoteRead)
		if err != nil {
			c.active = false
			q.nakError(env, c.reqPSN, wire.NAKRemoteAccess, WCRemAccessErr)
			break
		}
		var op wire.Opcode
		switch {
		case c.opening && last:
			op = wire.RCReadResponseOnly
		case c.opening:
			op = wire.RCReadResponseFirst
		case last:
			op = wire.RCReadResponseLast
		default:
			op = wire.RCReadResponseMiddle
		}
		h := wire.Headers{Opcode: op, PKey: DefaultPKey, DestQP: q.attr.DestQPN, PSN: uint32(c.psn),
			Syndrome: ackUnlimited, MSN: q.resp.msn}
		buf := env.TxBuffer()
		po, size, err := h.EncodeHeaders(buf, n)
		if err != nil {
			reg.Release()
			c.active = false // cannot happen: TxBuffer holds MaxPacketLen
			break
		}
		// A response that cannot leave is as good as lost on the wire:
		// the requester asks again (a Modify refuses paths that could
		// never be sent on, so this does not repeat forever).
		if inPlace && n > 0 {
			// The payload leaves from the region in place; the Env takes
			// the reference over and releases it after the send.
			_ = pe.TransmitPayload(po, reg.Bytes(), reg, size, &q.attr.AV)
		} else {
			copy(buf[po:po+n], reg.Bytes())
			reg.Release()
			_ = env.Transmit(size, &q.attr.AV)
		}
		q.ctr.SentPkts.Add(1)
		budget--
		c.va += uint64(n)
		c.resid -= n
		c.psn = c.psn.Next()
		c.opening = false
		if last {
			c.active = false
		}
	}
	return budget
}
