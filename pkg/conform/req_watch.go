package conform

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rxed/rxed/pkg/wire"
)

// Helpers of the requester scenarios: the peer's timers, its first
// request, and watching its (re)transmissions while answers are withheld.

// Sets of tools whose client is a requester.
var (
	reqTools  = []Tool{IBWriteBW, IBReadBW, IBAtomicBW, IBSendBW, IBVRCPingpong}
	ackTools  = []Tool{IBWriteBW, IBSendBW, IBVRCPingpong} // requests completed by ACKs
	pipeTools = []Tool{IBWriteBW, IBSendBW}                // several messages outstanding
	rnrTools  = []Tool{IBSendBW, IBVRCPingpong}            // SENDs: RNR NAK applies
)

// ackTimeout is the peer's local ACK timeout, 4.096 us x 2^timeout (IBA
// 9.7.6.1.3).
func (c *Conn) ackTimeout() time.Duration {
	return time.Duration(4096<<c.Cfg.PeerACKTimeout) * time.Nanosecond
}

// qpParams says which of the peer's QP parameters a verdict assumed.
func (c *Conn) qpParams() string {
	src := "the tools' defaults"
	if c.Cfg.PeerParamsSet {
		src = "as configured"
	}
	return fmt.Sprintf("peer timeout %d (%v), retry_cnt %d, rnr_retry %d: %s", c.Cfg.PeerACKTimeout,
		c.ackTimeout().Round(time.Microsecond), c.Cfg.PeerRetry, c.Cfg.PeerRNRRetry, src)
}

// firstRequest waits for the peer's first request of the run.
func (c *Conn) firstRequest(ctx context.Context) (*Rx, Outcome, bool) {
	r, ok := c.NextRequest(ctx, 3*time.Second)
	if !ok {
		return nil, Errorf("the peer's client sent no request within 3s of its exchange"), false
	}
	if r.PSN() != c.srv.ePSN {
		return nil, Failf("first request %s, but the exchange announced PSN %#x", r, c.srv.ePSN), false
	}
	return r, Outcome{}, true
}

// sends is one transmission of the PSN a scenario watches.
type sends struct {
	at  []time.Duration
	pkt []*Rx
}

func (s *sends) n() int { return len(s.at) }

// gaps are the intervals between consecutive transmissions.
func (s *sends) gaps() []time.Duration {
	var g []time.Duration
	for i := 1; i < len(s.at); i++ {
		g = append(g, s.at[i]-s.at[i-1])
	}
	return g
}

func fmtDurs(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Round(100 * time.Microsecond).String()
	}
	return strings.Join(parts, " ")
}

// watchPSN records the peer's transmissions of psn (the first one, first,
// when given) without answering anything, until quiet passes with no
// transmission of it, at most limit transmissions, or ctx ends. on, when
// set, is called with every transmission of psn (after recording it) and
// may answer it; it returns false to stop watching.
func (c *Conn) watchPSN(ctx context.Context, psn uint32, first *Rx, quiet time.Duration, limit int, on func(r *Rx, n int) bool) *sends {
	s := &sends{}
	if first != nil {
		s.at, s.pkt = append(s.at, first.At), append(s.pkt, first)
		if on != nil && !on(first, 1) {
			return s
		}
	}
	for s.n() < limit && ctx.Err() == nil {
		r, ok := c.Next(ctx, quiet, func(r *Rx) bool { return c.IsRequest(r) && r.PSN() == psn })
		if !ok {
			break
		}
		s.at, s.pkt = append(s.at, r.At), append(s.pkt, r)
		if on != nil && !on(r, s.n()) {
			break
		}
	}
	return s
}

// quietFor is how long a scenario waits to be sure a requester with the
// peer's timeout has given up: two timeouts (four when the timer may run
// long) plus scheduling slack.
func (c *Conn) quietFor() time.Duration {
	return 4*c.ackTimeout() + 100*time.Millisecond
}

// isFatalNAKHandled judges the peer's reaction to a response that must
// end its request (a fatal NAK, a bad or unexpected response): no
// retransmission of psn, and its QP in the error state (the liveness probe
// is not answered) or its tool ended with an error.
func (c *Conn) judgeEnded(ctx context.Context, psn uint32, what string, allowRetry bool) Outcome {
	again, ok := c.Next(ctx, c.quietFor(), func(r *Rx) bool { return c.IsRequest(r) && r.PSN() == psn })
	if ok {
		if allowRetry {
			c.Serve(again)
			return Passf("%s: the response was dropped and psn=%#x requested again (%s); answered, the run continues", what, psn, again)
		}
		return Failf("%s: the peer retransmitted psn=%#x (%s): this error is not retried", what, psn, again)
	}
	c.MarkBroken()
	if c.ToolReportsEnd() {
		if err, ended := c.ToolEnded(ctx, 2*time.Second); ended {
			if err == nil {
				return Failf("%s: no retransmission, but the tool finished its run as if psn=%#x had completed", what, psn)
			}
			return Passf("%s: no retransmission of psn=%#x in %v; the tool ended with an error (%v)", what, psn, c.quietFor(), shortErr(err))
		}
	}
	ev, alive := c.PeerQPAlive(ctx)
	if alive {
		return Failf("%s: no retransmission of psn=%#x in %v and the QP still serves (%s): the response was taken as a completion", what, psn, c.quietFor(), ev)
	}
	return Passf("%s: no retransmission of psn=%#x in %v; %s", what, psn, c.quietFor(), ev)
}

// maxRacedRetransmissions bounds the retransmissions a fatal NAK may
// meet on the way: ones the peer's timer sent before the NAK took effect.
const maxRacedRetransmissions = 2

// judgeFatalNAK judges the peer's reaction to a fatal NAK (code) for its
// request r: the NAK must end the request, never cause a retransmission.
// A retransmission its timer had sent before it processed the NAK is no
// retry of the NAK: a descheduled requester (its timer at T fires while
// the NAK waits in its receive queue) sends one, under -race on a loaded
// host one arrived 237 ms after the first transmission with T = 134 ms.
// Such a retransmission arrives on the timer's schedule (timerEarly would
// not call it early) and is NAKed again; one sooner than that, the NAK
// drove it, and more than maxRacedRetransmissions mean the peer ignores
// the NAK: both FAIL. Then the QP must be in the error state or the tool
// must end with an error (judgeEnded).
func (c *Conn) judgeFatalNAK(ctx context.Context, r *Rx, code uint8) Outcome {
	what := "NAK(" + wire.NAKCodeName(code) + ")"
	at := []time.Duration{r.At}
	for {
		again, ok := c.Next(ctx, c.quietFor(), func(x *Rx) bool { return c.IsRequest(x) && x.PSN() == r.PSN() })
		if !ok {
			break
		}
		at = append(at, again.At)
		n := len(at) - 1
		switch {
		case again.At-r.At < time.Duration(n)*c.ackTimeout()-c.ackTimeout()/2:
			return Failf("%s: the peer retransmitted psn=%#x %v after its first transmission (%s), sooner than its timer (T=%v): the NAK was retried",
				what, r.PSN(), (again.At - r.At).Round(100*time.Microsecond), again, c.ackTimeout())
		case n > maxRacedRetransmissions:
			return Failf("%s: the peer retransmitted psn=%#x %d times after the NAK (last %s): this error is not retried",
				what, r.PSN(), n, again)
		}
		_ = c.SendNAK(r.PSN(), code, fmt.Sprintf("NAK %s again: retransmission %d came on the timer", wire.NAKCodeName(code), n))
	}
	out := c.judgeEnded(ctx, r.PSN(), what, false)
	if n := len(at) - 1; n > 0 && out.Verdict == Pass {
		out.Evidence += fmt.Sprintf(" (%d retransmission(s) on the timer's schedule, sent before the NAK took effect, NAKed again)", n)
	}
	return out
}

func shortErr(err error) string {
	s := err.Error()
	if len(s) > 100 {
		s = s[:100] + "..."
	}
	return s
}

// Retransmission timing is judged on the schedule, not on each interval.
// The intervals are measured where the packets arrive, and either end may
// be descheduled (a loaded host, -race, an emulated guest): under -race on
// a loaded 2-core machine rxed's client showed single intervals of 1.3 ms
// and 1.69 s around a 134 ms timer, and pairs such as 185 ms + 87 ms and
// 274 ms + 4 ms, whose sum is two timeouts: the requester kept its
// schedule (its timer runs from when a packet was queued), only a delivery
// was late. Per-interval bounds fail such a peer; the schedule does not:
//
//   - early (timerEarly): the n-th retransmission arrives no sooner than
//     (n-1) x T after the first transmission. One interval of slack absorbs
//     a late first arrival; a timer at 3/4 T or less fails with 7 retries,
//     at T/2 or less with 3.
//   - late (timerLate): the median interval is at most 4T (IBA 9.7.6.1.3
//     bounds the wait by the encoded value; implementations round up), so
//     a stall or two do not count, a timer 8x too long does.

// timerEarly reports whether the transmissions at (arrival times, the
// first transmission first) came sooner than a timer of t allows.
func timerEarly(at []time.Duration, t time.Duration) bool {
	n := len(at) - 1
	return n >= 2 && at[n]-at[0] < time.Duration(n-1)*t
}

// timerLate reports whether the median interval exceeds 4t (plus 50 ms of
// scheduling slack).
func timerLate(at []time.Duration, t time.Duration) bool {
	var g []time.Duration
	for i := 1; i < len(at); i++ {
		g = append(g, at[i]-at[i-1])
	}
	if len(g) == 0 {
		return false
	}
	slices.Sort(g)
	return g[len(g)/2] > 4*t+50*time.Millisecond
}

// timersOK judges s's retransmission schedule against the peer's local
// ACK timeout.
func (c *Conn) timersOK(s *sends) bool {
	return !timerEarly(s.at, c.ackTimeout()) && !timerLate(s.at, c.ackTimeout())
}

// timerRule says what timersOK checks, for evidence.
func (c *Conn) timerRule() string {
	t := c.ackTimeout()
	return fmt.Sprintf("want the n-th retransmission >= (n-1) x T after the first transmission and the median interval <= 4T = %v (T=%v)",
		(4 * t).Round(time.Millisecond), t.Round(time.Microsecond))
}

// patience is how long a scenario that needs more retransmissions waits
// for the next before it concludes the peer gave up: much longer than the
// peer's timer, since a descheduled peer or engine delays a retransmission
// by a second and more (seen under -race on a loaded 2-core host). It
// costs nothing when the peer is on time; the verdict "gave up too early"
// then rests on seconds of silence, not on one late packet.
func (c *Conn) patience() time.Duration {
	return max(c.quietFor(), 3*time.Second)
}

// awaitRequest waits for a request of the peer's that the verdict needs
// (one match accepts; nil: any), for patience plus extra (a timer the
// scenario asked the peer to wait out first). Every scenario whose
// verdict needs another transmission waits here, not for quietFor: a
// window that short failed peers whose retransmission came once late.
func (c *Conn) awaitRequest(ctx context.Context, extra time.Duration, match func(*Rx) bool) (*Rx, bool) {
	return c.Next(ctx, c.patience()+extra, func(x *Rx) bool { return c.IsRequest(x) && (match == nil || match(x)) })
}

// samePSN matches a packet with PSN psn.
func samePSN(psn uint32) func(*Rx) bool { return func(x *Rx) bool { return x.PSN() == psn } }
