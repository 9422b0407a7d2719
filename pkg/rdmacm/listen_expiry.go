package rdmacm

import (
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/wire/mad"
)

// When a queued connection request expires.
//
// A request waits in its listener's backlog until Accept takes it, and
// nothing in rdma_cm times it out on the passive side (the kernel's ucma
// keeps it as long as the application does not read the event). Its
// active side does not wait as long: cm.c's ib_send_cm_req sends the REQ
// and resends it every timeout_ms = 2 x packet life time + the REQ's
// Remote CM Response Timeout, Max CM Retries times; when the last wait
// ends unanswered, cm_process_send_error resets the ID to idle and
// rdma_cm reports RDMA_CM_EVENT_UNREACHABLE: the connection is given up
// without a word to us, and its comm ID no longer exists there. A REQ
// forged once (or a client that gave up) would sit in the backlog for
// good, and an application accepting one request at a time spent a REP
// timeout on each before reaching a real client.
//
// So a queued REQ expires once its active side cannot be waiting any
// more, by the REQ's own fields, on the CM's clock from the moment the
// REQ arrived (it left no later than that): reqWaitBound, capped at
// maxQueuedREQ, since those fields are the sender's to choose. Accept
// skips an expired request and admission counts it as no room taken;
// either refuses it with REJ 28 (consumer defined), what cm.c's cm_destroy_id
// sends for an unanswered request in MRA_REQ_SENT when ucma destroys it,
// and counts it req_expired. The REJ finds no comm ID at a peer that
// gave up (cm_rej_handler drops it) and tells one whose clock ran slower
// than the bound assumes to stop waiting.
//
// A SIDR_REQ carries no timeouts, but its requester's are fixed: rdma_cm
// resolves a UD service (cma_resolve_ib_udp) with timeout_ms 1 <<
// (CMA_CM_RESPONSE_TIMEOUT - 8) = 4096 ms and CMA_MAX_CM_RETRIES 15, and
// ib_send_cm_sidr_req's MAD is sent 16 times, each waiting that long,
// before the query ends with RDMA_CM_EVENT_UNREACHABLE; DialUD's query
// (cm.SIDRQuery's defaults) is the same, or shorter with a
// ConnParam.Timeout. So a queued SIDR_REQ expires sidrWaitBound after it
// arrived (the CM drops the duplicates of a queued one, so it is the
// first of its requester's to reach us), as a REQ does: a SIDR_REQ forged
// once used to sit in the backlog until the application accepted it. It
// is refused as the backlog's other refusals of a SIDR_REQ are, with
// SIDR_REP REJECT, and counted req_expired.

// Expiry is active: the backlog keeps one timer on the CM's clock, armed
// for the earliest deadline of its requests and re-armed as they come and
// go (rearmLocked), which refuses what expired when it fires (fire), as
// Accept and admission do when they meet it. Checking only when a request
// arrives or Accept runs bounded the memory (the backlog's size), but not
// what else an expired request holds: its CM ID counts against the
// device's MaxHalfOpen, shared by every listener, so an idle listener's
// dead requests kept places another listener's REQs were refused (REJ 3)
// for; and a request cut short by maxQueuedREQ has a peer still waiting,
// whom only the REJ tells. One timer per backlog, not one per request:
// nothing more to stop or leak when requests leave, and a callback of a
// timer replaced meanwhile (its Stop came too late) finds nothing due and
// leaves the current one armed.

// reqWaitBound is the longest an active side may still be waiting for an
// answer to req after we received it. Every wait is bounded by the larger
// of the REQ's own (cm.c's timeout_ms) and the one our MRA sets: while a
// request is queued its ID is in MRA_REQ_SENT, and a retransmitted REQ is
// answered with an MRA of mraServiceTimeout (cm_dup_req_handler), which
// makes that wait and every later one last the service timeout plus the
// packet life time (cm_mra_handler's ib_modify_mad). There are Max CM
// Retries + 1 waits; the MRA restarts at most one of them (a duplicate
// MRA changes nothing), a round trip (2 x packet life time) after it
// began. The packet life time is the REQ's Local ACK Timeout - 1, as
// cm_format_paths_from_req takes it; the active side computed that
// timeout from its packet life time and CA ACK delay (cm_ack_timeout),
// so the life time derived here is never shorter than the one it waits
// by.
func reqWaitBound(req *mad.REQ) time.Duration {
	ack := req.Primary.LocalACKTimeout
	life := cm.CMTimeout(ack - min(ack, 1))
	reqWait := 2*life + cm.CMTimeout(req.RemoteCMResponseTimeout)
	mraWait := cm.CMTimeout(mraServiceTimeout) + cm.CMTimeout(ack)
	return time.Duration(int(req.MaxCMRetries)+1)*max(reqWait, mraWait) + 2*life
}

// maxQueuedREQ caps how long a REQ waits in a backlog, whatever its
// fields say. Without it a forger's choice (Remote CM Response Timeout
// 31, 2^23 ms = 2.3 hours a wait by cm_convert_to_ms, and 15 retries) kept its
// request queued for about 37 hours. An honest rdma_cm peer never waits
// that long: cma.c's REQ has CMA_CM_RESPONSE_TIMEOUT 20 and
// CMA_MAX_CM_RETRIES 15, and on RoCE the packet life time
// CMA_IBOE_PACKET_LIFETIME (18, Local ACK Timeout 19 in shared/pcaps'
// REQs; 16 in later kernels), for a reqWaitBound of 100.4 s (74.2 s with
// 16): 2 minutes leaves a fifth more for a peer whose clock runs slower
// than ours. A request still queued then has not been taken by the
// application for 2 minutes either; it is refused with REJ 28 as any
// expired one, what a kernel listener's application sends when it
// destroys a request it never answered, so a peer still waiting is told.
const maxQueuedREQ = 2 * time.Minute

// reqResidency is how long req may stay queued: until its active side
// has given up (reqWaitBound), at most maxQueuedREQ.
func reqResidency(req *mad.REQ) time.Duration {
	return min(reqWaitBound(req), maxQueuedREQ)
}

// sidrWaitBound is how long after we received it a SIDR_REQ's requester
// may still be waiting for our SIDR_REP: rdma_cm's 16 tries of 4096 ms
// (above), 65.5 s.
const sidrWaitBound = (15 + 1) * 4096 * time.Millisecond

// expired reports whether r's active side can no longer be waiting at
// now (reqResidency, sidrWaitBound); never for a request without a
// deadline (the zero expires).
func (r *Request) expired(now time.Time) bool {
	return !r.expires.IsZero() && !now.Before(r.expires)
}

// expire refuses requests taken out of l's backlog because their active
// side has given up: REJ 28, as cm_destroy_id answers an unanswered
// request (SIDR_REP REJECT for a SIDR_REQ), counted req_expired.
func (l *Listener) expire(rs []*Request) {
	for _, r := range rs {
		l.a.reqExpired.Add(1)
		l.a.log.Debug("rdmacm: a queued request expired: its peer's retries are over",
			"listener", l.addr, "peer", r.peerGID, "remote", r.Remote, "ud", r.ud)
		rejectRequest(r)
	}
}

// Counter of the requests that expired in a backlog (Counters).
const cntReqExpired = "req_expired"

// expireWith makes b refuse its expired requests by itself: on clock's
// timer, handing them to onExpire outside b's lock.
func (b *backlog) expireWith(clock cm.Clock, onExpire func([]*Request)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.clock, b.onExpire = clock, onExpire
	b.rearmLocked()
}

// rearmLocked arms b's timer for the earliest deadline of its requests,
// stopping the one armed for another; none when no request has one.
// Requests come and go one at a time, so a scan of the few queued is all
// the bookkeeping.
func (b *backlog) rearmLocked() {
	if b.clock == nil {
		return
	}
	var next time.Time
	for _, r := range b.reqs {
		if !r.expires.IsZero() && (next.IsZero() || r.expires.Before(next)) {
			next = r.expires
		}
	}
	if b.timer != nil && next.Equal(b.timerAt) {
		return
	}
	if b.timer != nil {
		b.timer.Stop() // one already on its way finds nothing due (fire)
		b.timer = nil
	}
	b.timerAt = next
	if next.IsZero() {
		return
	}
	b.timerGen++
	gen := b.timerGen
	b.timer = b.clock.AfterFunc(max(0, next.Sub(b.clock.Now())), func() { b.fire(gen) })
}

// fire is timer number gen's: it takes out what expired by now, re-arms
// for the next deadline, and refuses the expired requests outside b's
// lock. A timer replaced before it ran (its Stop came too late) leaves the
// current one armed.
func (b *backlog) fire(gen uint64) {
	b.mu.Lock()
	if gen == b.timerGen {
		b.timer = nil // this one has fired: rearmLocked arms afresh
	}
	expired := b.expireLocked(b.clock.Now())
	b.rearmLocked()
	onExpire := b.onExpire
	b.mu.Unlock()
	if len(expired) > 0 {
		onExpire(expired)
	}
}
