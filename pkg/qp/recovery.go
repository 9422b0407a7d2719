package qp

import "time"

// Loss recovery faster than the local ACK timer.
//
// IBA gives an RC requester one clock, the local ACK timeout (4.096 us x
// 2^timeout; perftest and rdma_cm use 14, 67 ms), and rxe retransmits
// only when it expires, or on a NAK. Two losses get no NAK at all: a
// request resent after a NAK that is lost again (the responder NAKs a
// sequence error once, then drops silently until the missing PSN comes:
// rxe_resp.c's sent_psn_nak, IBA 9.7.5.1.1), and a lost NAK or a lost
// tail. Each of those cost a 67 ms stall: at 1% loss a 64 KiB WRITE
// stream kept 5% of its clean bandwidth, at 5% loss 0.2%.
//
// So the requester also keeps a retransmission timeout of its own, the
// way TCP does (RFC 6298): the round trip from a request to the response
// that acknowledges it is sampled (one PSN at a time, never a resent one:
// Karn's rule), smoothed, and a requester that has outstanding requests
// and hears nothing for srtt + 4 rttvar (at least minRTO, doubling on each
// expiry without progress) goes back to the oldest unacknowledged PSN.
// Until the first sample there is no estimate and only IBA's timer runs
// (TCP starts at 1 s for the same reason): a peer that has never answered
// sees exactly the local ACK timeout's schedule, and a slow one (an rxe
// guest under emulation) is not sent early duplicates.
// Resending early is always allowed: the responder answers duplicates
// from its state (IBA 9.7.5.1.3, C9-105) without executing them twice.
// What this timer does not do is count against retry_cnt: only the
// local ACK timeout does, so a dead peer is declared dead exactly when
// IBA says (retry_cnt + 1 timeouts), and a QP configured with a short
// timeout (below 2 minRTO) or none (0, infinite) keeps IBA's timer alone.
//
// The second half is what a requester sends: every loss rewinds the
// window (go-back-N), and a full window of 128 PSNs behind each loss
// under 5% loss is mostly resent data. A congestion window (cwnd, in
// PSNs) halves on a loss and grows by one PSN per window of acknowledged
// PSNs (TCP's AIMD), between minCwnd and MaxUnackedPSNs: IBA lets a
// requester keep fewer requests in flight than it may.
//
// It halves once per round trip, as TCP does once per window of data
// (NewReno's recovery point, RFC 6582): the losses of one window are one
// congestion event, and a requester that halved for each of them (a NAK,
// the resend lost again, its fast retransmit) fell to the floor within a
// few round trips at 1% loss and stayed there. And the floor is two
// 64 KiB messages, not one: with one message in flight the requester
// waits a whole round trip after each (stop-and-wait), and the traces of
// `rxed perf write` at 1% loss showed cwnd at 16-26 PSNs for the whole
// run. Measured A/B (`rxed perf write -s 65536 -n 2000`, loopback, path
// loss, 3 seeds, MB/s; clean 1490-2510): 1% 397-499 -> 582-683, 5%
// 195-238 -> 218-249; READ unchanged (1% 441-505, 5% 177-201: its
// pipeline is the READs outstanding, two at the floor). Without any
// window (cwnd fixed at 128) WRITE at 1% reaches 800-990 but 5%
// collapses to 18-108, every resend window itself losing a packet; and
// 800-990 (0.45x) is about what go-back-N allows here at all: a loss
// throws away the window behind it, 1/(1 + p W) of the packets sent are
// useful, and this host needs W near 128 for its clean bandwidth.

const (
	// minRTO bounds the fast retransmit from below. Round trips over
	// loopback are tens of microseconds and the estimate's 4 rttvar
	// absorbs a loaded host's scheduling delays; a spurious expiry
	// costs one resent window, which the responder answers as
	// duplicates. In the deterministic loss model (loss_goodput_test.go)
	// 1 ms kept 0.51x / 0.11x of the clean goodput at 1% / 5% loss,
	// 250 us 0.74x / 0.29x.
	minRTO = 250 * time.Microsecond
	// maxRTOBackoff caps the doublings (64 minRTO at most; the local ACK
	// timer, which counts retries, runs beside it anyway).
	maxRTOBackoff = 6
	// minCwnd is the smallest congestion window in PSNs: two 64 KiB
	// messages at MTU 4096, so that one is sent while the other's ACK
	// comes back.
	minCwnd = 32
)

// recovery is the requester's round-trip estimate, fast retransmit timer
// and congestion window. Owned by whoever runs the QP's protocol work.
type recovery struct {
	srtt, rttvar time.Duration // RFC 6298's estimates; srtt 0: no sample yet
	sampling     bool          // samplePSN is being timed
	samplePSN    PSN
	sampleAt     time.Time
	rtoAt        time.Time // fast retransmit deadline; zero when not armed
	backoff      uint8     // fast retransmits since the last progress
	cwnd         int       // congestion window in PSNs
	acked        int       // PSNs acknowledged towards the next cwnd increment
	// recoverPSN is the PSN after the last one sent when the window last
	// halved (valid while recovering): losses of PSNs before it belong to
	// the same congestion event and do not halve it again.
	recoverPSN PSN
	recovering bool
}

// resetRecovery forgets everything (a QP reset).
func (q *QP) resetRecovery() { q.rec = recovery{cwnd: MaxUnackedPSNs} }

// fastRetransmits reports whether the QP keeps the fast retransmit timer:
// RC with a local ACK timeout long enough to be worth beating (its
// eighth at least minRTO).
func (q *QP) fastRetransmits() bool {
	return q.typ == RC && q.timeout >= 8*minRTO && !q.ibaTimerOnly
}

// rto is the current fast retransmit timeout (once srtt is known).
func (q *QP) rto() time.Duration {
	r := q.rec.srtt + 4*q.rec.rttvar
	// Capped at a quarter of IBA's timeout: a requester whose estimate a
	// loaded host inflated, or that backed off, still retries a few times
	// before the local ACK timer spends a retry (and then waits 67 ms).
	return min(max(minRTO, r)<<q.rec.backoff, q.timeout/4)
}

// noteRequestSent is called after each request packet leaves, psn being
// its PSN and resent whether it had been sent before (go-back-N): it
// starts a round-trip sample on a new PSN and arms the fast retransmit.
func (q *QP) noteRequestSent(psn PSN, resent bool, now time.Time) {
	if !q.fastRetransmits() {
		return
	}
	if !q.rec.sampling && !resent {
		q.rec.sampling, q.rec.samplePSN, q.rec.sampleAt = true, psn, now
	}
	if q.rec.rtoAt.IsZero() && q.rec.srtt > 0 {
		q.rec.rtoAt = now.Add(q.rto())
	}
}

// noteProgress is called after a response moved the oldest
// unacknowledged PSN from before to comp.psn: it takes the round-trip
// sample if the timed PSN is now acknowledged, grows the window, and
// restarts (or stops) the fast retransmit timer.
func (q *QP) noteProgress(before PSN, now time.Time) {
	adv := int(q.comp.psn.Diff(before))
	if adv <= 0 {
		return
	}
	r := &q.rec
	if r.sampling && r.samplePSN.Diff(q.comp.psn) < 0 {
		r.sampling = false
		q.sampleRTT(now.Sub(r.sampleAt))
	}
	r.backoff = 0
	if r.recovering && q.comp.psn.Diff(r.recoverPSN) >= 0 {
		r.recovering = false // the event is over (and PSNs may wrap later)
	}
	if q.req.psn.Diff(q.comp.psn) < 0 && q.attr.State != Err {
		// The responder acknowledged past what a go-back-N has resent
		// so far (the window cut the resend short, then an ACK for a
		// later duplicate came): the requester must not carry on from
		// a PSN the responder has already used, or its next message
		// starts at an old PSN (taken as a duplicate) and the rest
		// arrives as MIDDLE without FIRST: NAK invalid request.
		q.goBackN()
	}
	if r.acked += adv; r.acked >= r.cwnd {
		r.acked -= r.cwnd
		r.cwnd = min(r.cwnd+1, MaxUnackedPSNs)
	}
	r.rtoAt = time.Time{}
	if q.fastRetransmits() && r.srtt > 0 && q.req.psn != q.comp.psn && q.attr.State != Err {
		r.rtoAt = now.Add(q.rto())
	}
}

// sampleRTT folds one round trip into the estimates (RFC 6298 2.2-2.3).
func (q *QP) sampleRTT(rtt time.Duration) {
	r := &q.rec
	rtt = max(rtt, time.Nanosecond) // srtt 0 means no sample
	if r.srtt == 0 {
		r.srtt, r.rttvar = rtt, rtt/2
		return
	}
	d := r.srtt - rtt
	if d < 0 {
		d = -d
	}
	r.rttvar += (d - r.rttvar) / 4
	r.srtt += (rtt - r.srtt) / 8
}

// noteLoss is called on every loss signal the requester acts on (a NAK,
// an implied NAK, a gap in READ responses, a timeout), before it goes
// back. The round trip being timed is dropped if its PSN will be resent;
// one the NAK acknowledged keeps it (noteProgress takes it next: it used
// to be thrown away too, and at 5% loss a connection could lose every
// sample before its first and keep IBA's 67 ms timer alone). The window
// halves unless the loss is of the congestion event it last halved for
// (a PSN sent before that halving).
func (q *QP) noteLoss() {
	r := &q.rec
	if r.sampling && r.samplePSN.Diff(q.comp.psn) >= 0 {
		r.sampling = false
	}
	if r.recovering && q.comp.psn.Diff(r.recoverPSN) < 0 {
		return
	}
	r.recovering, r.recoverPSN = true, q.req.psn
	r.cwnd = max(r.cwnd/2, minCwnd)
	r.acked = 0
}

// cwndFull reports that the congestion window is used up.
func (q *QP) cwndFull() bool {
	return q.typ == RC && int(q.req.psn.Diff(q.comp.psn)) > q.rec.cwnd
}

// onFastRetransmit runs when the fast retransmit timer expires: with
// requests outstanding and no RNR wait, go back to the oldest
// unacknowledged PSN without spending retry_cnt, and back the timer off.
func (q *QP) onFastRetransmit(now time.Time) {
	r := &q.rec
	r.rtoAt = time.Time{}
	if q.attr.State != RTS && q.attr.State != SQD || !q.rnrAt.IsZero() {
		return
	}
	if q.headWQE() == nil {
		return
	}
	q.ctr.FastRetransmits.Add(1)
	q.noteLoss()
	q.goBackN()
	// As after a NAK: one go-back per loss until progress, so the NAK
	// that may still come for the same gap does not rewind again.
	q.comp.startedRetry = true
	r.backoff = min(r.backoff+1, maxRTOBackoff)
	r.rtoAt = now.Add(q.rto())
}
