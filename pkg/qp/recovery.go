package qp

import (
	"math"
	"time"
)

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
// expiry until a PSN first sent after it is acknowledged) goes back to the
// oldest unacknowledged PSN.
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
// Nor does it go on resending to a peer that answers nothing: after
// maxUnansweredFastRetransmits go-backs with no response since, it stops
// until a response comes, so a dead peer is sent three windows more than
// rxe would send it, not one every quarter timeout.
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
//
// And random loss is not congestion. On loopback (and on the lossless
// fabrics RoCE is built for) a packet lost says nothing about a queue,
// yet at 1% loss one came every few round trips and AIMD never climbed
// off its floor: `rxed perf write` at 1% ran at 32 PSNs the whole time,
// where this host delivers 1.4-1.6x more per doubling of the window. So a
// loss halves the window no lower than a floor (lossFloor) chosen for
// goodput: the requester measures what each window class (32, 64, 128
// PSNs) delivers per round trip, and a loss takes the window no lower
// than the class whose rate over 1 + p W is highest, p the loss rate
// over about the last lossHorizon PSNs acknowledged (go-back-N resends
// about a window per loss, 1/(1 + p W) of what is sent being new). A
// path whose round trip is a queue (the deterministic model's wire: every
// window delivers the same) keeps the smallest class, AIMD as before; a
// path bound by latency, as the software stack here, keeps the larger
// window at 1% and the smallest at 5%. A class not measured lately is
// guessed (expectedRate), so the window visits it again where it may pay.
// `rxed perf write -s 65536 -n 2000`, path loss, A/B in one session,
// medians of 5 seeds, MB/s: 1% 481 -> 722 and 541 -> 652; 5% 225 -> 198
// and 211 -> 207; READ within the noise (1%: 486 -> 486 over 8 seeds). The
// model: 1% 0.755x -> 0.708x (the probes), 5% unchanged.

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
	// maxUnansweredFastRetransmits is how many times the fast retransmit
	// goes back with no response since: then it stops until one comes,
	// and IBA's timer alone resends, once per local ACK timeout, as rxe
	// does. A loss is answered within a resend or two (at 5% loss three
	// resends in a row all lost come once in 8000 losses); a peer that
	// answers none of them is more likely dead, and a warmed-up
	// requester going back every quarter timeout (the backoff's cap)
	// sent one 4,704 packets before it gave up, 73 windows to rxe's 8.
	maxUnansweredFastRetransmits = 3
	// minCwnd is the smallest congestion window in PSNs: two 64 KiB
	// messages at MTU 4096, so that one is sent while the other's ACK
	// comes back.
	minCwnd = 32
	// lossHorizon is about how many acknowledged PSNs the loss rate is
	// taken over (both counts halve when it is reached).
	lossHorizon = 4096
	// rateDecay and probeAfter tune lossFloor's delivery rates: each
	// sample of a window class takes 1/rateDecay off its figure before
	// the maximum, and a class not measured in probeAfter round trips is
	// guessed again (and so measured again when the guess wins).
	rateDecay  = 8
	probeAfter = 64
)

// recovery is the requester's round-trip estimate, fast retransmit timer
// and congestion window. Owned by whoever runs the QP's protocol work.
type recovery struct {
	srtt, rttvar time.Duration // RFC 6298's estimates; srtt 0: no sample yet
	sampling     bool          // samplePSN is being timed
	samplePSN    PSN
	sampleAt     time.Time
	rtoAt        time.Time // fast retransmit deadline; zero when not armed
	backoff      uint8     // fast retransmits since rtoEnd was acknowledged
	unanswered   uint8     // fast retransmits since the last response that made progress
	rtoEnd       PSN       // first PSN not yet sent at the last expiry
	cwnd         int       // congestion window in PSNs
	acked        int       // PSNs acknowledged towards the next cwnd increment
	// recoverPSN is the PSN after the last one sent when the window last
	// halved (valid while recovering): losses of PSNs before it belong to
	// the same congestion event and do not halve it again.
	recoverPSN PSN
	recovering bool
	lossAt     time.Time // the last loss the responder reported (errorRetry); zero: none yet
	// The loss rate: lossEvents loss signals per lossPSNs PSNs
	// acknowledged, over about the last lossHorizon of them.
	lossPSNs, lossEvents float64
	// What each window delivers (lossFloor): rates[c] for window class
	// c (windowClasses), from the round trips timed while cwnd was in it.
	sampleComp PSN    // comp.psn when the timed PSN was sent
	sampleCwnd int    // cwnd when the timed PSN was sent
	samples    uint64 // round trips timed, ever
	rates      [len(windowClasses)]windowRate
}

// resetRecovery forgets everything (a QP reset).
func (q *QP) resetRecovery() { q.rec = recovery{cwnd: MaxUnackedPSNs} }

// fastRetransmits reports whether the QP keeps the fast retransmit timer:
// RC with a local ACK timeout long enough to be worth beating (its
// eighth at least minRTO).
func (q *QP) fastRetransmits() bool {
	return q.typ == RC && q.timeout >= 8*minRTO && !q.ibaTimerOnly
}

// fastTimerArmable reports whether the fast retransmit timer may run:
// the QP keeps it, has a round-trip estimate, and has not gone back
// maxUnansweredFastRetransmits times with no answer since.
func (q *QP) fastTimerArmable() bool {
	return q.fastRetransmits() && q.rec.srtt > 0 && q.rec.unanswered < maxUnansweredFastRetransmits
}

// restartFastTimer arms the fast retransmit timer afresh after a go-back
// on a NAK or on IBA's timeout: the window just rewound is resent from
// now, and a deadline left from before the go-back would resend it again
// before its answer could come.
func (q *QP) restartFastTimer(now time.Time) {
	q.rec.rtoAt = time.Time{}
	if q.fastTimerArmable() && q.rnrAt.IsZero() && q.attr.State != Err {
		q.rec.rtoAt = now.Add(q.rto())
	}
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
		q.rec.sampleComp, q.rec.sampleCwnd = q.comp.psn, q.rec.cwnd
	}
	if q.rec.rtoAt.IsZero() && q.fastTimerArmable() {
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
	q.comp.refills = 0 // progress: retry_cnt may be refilled again (handleResponse)
	r := &q.rec
	r.unanswered = 0 // the peer answers: the fast retransmit may run again
	if r.sampling && r.samplePSN.Diff(q.comp.psn) < 0 {
		r.sampling = false
		rtt := now.Sub(r.sampleAt)
		q.sampleRTT(rtt)
		// The PSNs acknowledged over the round trip (comp.psn only
		// moves on).
		r.sampleRate(uint64(max(q.comp.psn.Diff(r.sampleComp), 0)), rtt)
	}
	// The backoff ends when a PSN first sent after the last expiry is
	// acknowledged: the timeout then outlasted a round trip (Karn's
	// algorithm, RFC 6298 5.5-5.7). Not on any progress: that may be the
	// answer to what the expiry resent, or to the original whose answer
	// was late, and a round trip that grew past the timeout would time
	// out every window, each expiry dropping the window's sample, so the
	// estimate would never learn it.
	if r.backoff > 0 && q.comp.psn.Diff(r.rtoEnd) > 0 {
		r.backoff = 0
	}
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
	if r.lossPSNs += float64(adv); r.lossPSNs >= lossHorizon {
		r.lossPSNs, r.lossEvents = r.lossPSNs/2, r.lossEvents/2
	}
	if r.acked += adv; r.acked >= r.cwnd {
		r.acked -= r.cwnd
		r.cwnd = min(r.cwnd+1, MaxUnackedPSNs)
	}
	r.rtoAt = time.Time{}
	if q.fastTimerArmable() && q.req.psn != q.comp.psn && q.attr.State != Err && q.rnrAt.IsZero() {
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

// windowClasses are the windows whose delivery rates the loss floor
// compares.
var windowClasses = [...]int{minCwnd, 2 * minCwnd, MaxUnackedPSNs}

// windowClass is the largest class cwnd reaches (0 below minCwnd too).
func windowClass(cwnd int) int {
	c := 0
	for i, w := range windowClasses {
		if cwnd >= w {
			c = i
		}
	}
	return c
}

// windowRate is what one window class delivers: rate, PSNs acknowledged
// per second over a round trip, the highest of its recent samples (each
// sample takes 1/rateDecay off the old figure first), measured at the
// at'th round trip timed (0: never).
type windowRate struct {
	rate float64
	at   uint64
}

// sampleRate folds one round trip, over which delivered PSNs were
// acknowledged, into the delivery rate of the window it was sent with.
func (r *recovery) sampleRate(delivered uint64, rtt time.Duration) {
	r.samples++
	c := &r.rates[windowClass(r.sampleCwnd)]
	c.rate = max(float64(delivered)/max(rtt, time.Nanosecond).Seconds(), c.rate-c.rate/rateDecay)
	c.at = r.samples
}

// expectedRate is what window class c is taken to deliver: its
// measurement while fresh (taken within the last probeAfter round
// trips), else a guess from the nearest fresh class, optimistic enough
// that the window goes to measure it where it may pay: a smaller window
// as much as a larger one, a larger one more by the square root of the
// windows' ratio (`rxed perf write` on loopback: 1.4-1.6x per doubling; a
// path bound by a queue, the deterministic model's, gives 1x).
// 0: nothing to go by.
func (r *recovery) expectedRate(c int) float64 {
	fresh := func(i int) bool { return r.rates[i].at > 0 && r.samples-r.rates[i].at <= probeAfter }
	if fresh(c) {
		return r.rates[c].rate
	}
	for d := 1; d < len(windowClasses); d++ {
		if i := c + d; i < len(windowClasses) && fresh(i) {
			return r.rates[i].rate
		}
		if i := c - d; i >= 0 && fresh(i) {
			return r.rates[i].rate * math.Sqrt(float64(windowClasses[c])/float64(windowClasses[i]))
		}
	}
	return r.rates[c].rate
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
	r.lossEvents++
	if r.recovering && q.comp.psn.Diff(r.recoverPSN) < 0 {
		return
	}
	r.recovering, r.recoverPSN = true, q.req.psn
	r.cwnd = max(r.cwnd/2, minCwnd, r.lossFloor())
	r.acked = 0
}

// lossRecentSpan is how long after the last loss the responder reported
// a requester counts as losing packets (LossRecent).
const lossRecentSpan = 20 * time.Millisecond

// LossRecent reports whether the responder reported a loss (a NAK, an
// implied NAK, a gap in a READ's responses) within lossRecentSpan of now:
// the requester's short timers are then likely to run out with nothing
// else going on, and roce's idle waker wakes an idle process for them.
// Not a timeout of its own: on a loaded host a clean connection's fast
// retransmit timer fires now and then for a round trip that was only
// late, and waking the process for every deadline after it cost the
// 8-byte SEND ping-pong's p99 12 -> 29 us (docs/performance.md, session V).
func (q *QP) LossRecent(now time.Time) bool {
	return !q.rec.lossAt.IsZero() && now.Sub(q.rec.lossAt) < lossRecentSpan
}

// lossFloor is the window a loss does not take the congestion window
// below: of the window classes, the one expected to give the most
// goodput at the current loss rate, its delivery rate over 1 + p W
// (go-back-N resends about a window per loss). No loss or no round trip
// measured yet: no floor but minCwnd.
func (r *recovery) lossFloor() int {
	if r.lossEvents == 0 {
		return 0
	}
	p := r.lossEvents / max(r.lossPSNs, 1)
	best, floor := 0.0, 0
	for i, w := range windowClasses {
		if g := r.expectedRate(i) / (1 + p*float64(w)); g > best {
			best, floor = g, w
		}
	}
	return floor
}

// cwndFull reports that the congestion window is used up.
func (q *QP) cwndFull() bool {
	return q.typ == RC && int(q.req.psn.Diff(q.comp.psn)) > q.rec.cwnd
}

// onFastRetransmit runs when the fast retransmit timer expires: with
// requests outstanding and no RNR wait, go back to the oldest
// unacknowledged PSN without spending retry_cnt, and back the timer off,
// or leave it off after maxUnansweredFastRetransmits go-backs without a
// response.
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
	if r.backoff == 0 || q.req.psn.Diff(r.rtoEnd) > 0 {
		r.rtoEnd = q.req.psn
	}
	q.noteLoss()
	q.goBackN()
	// As after a NAK: one go-back per loss until progress, so the NAK
	// that may still come for the same gap does not rewind again.
	q.comp.startedRetry = true
	r.backoff = min(r.backoff+1, maxRTOBackoff)
	r.unanswered++
	if q.fastTimerArmable() {
		r.rtoAt = now.Add(q.rto())
	}
}
