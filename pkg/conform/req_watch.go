package conform

import (
	"context"
	"fmt"
	"strings"
	"time"
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

func shortErr(err error) string {
	s := err.Error()
	if len(s) > 100 {
		s = s[:100] + "..."
	}
	return s
}

// withinTimer checks one retransmission interval against the peer's
// local ACK timeout T: at least T, at most 4T (an implementation's timer
// may round up; IBA 9.7.6.1.3 bounds the wait by the encoded value). The
// intervals are measured where the packets arrive, so one late delivery
// shortens the next interval: the lower bound allows T/10 of that jitter
// (timersOK checks the total exactly).
func (c *Conn) withinTimer(g time.Duration) bool {
	t := c.ackTimeout()
	return g >= t-max(2*time.Millisecond, t/10) && g <= 4*t+50*time.Millisecond
}

// timersOK checks every interval of s and that the n-th retransmission
// came no earlier than n timeouts after the first transmission.
func (c *Conn) timersOK(s *sends) bool {
	for _, g := range s.gaps() {
		if !c.withinTimer(g) {
			return false
		}
	}
	n := s.n() - 1
	return n <= 0 || s.at[n]-s.at[0] >= time.Duration(n)*c.ackTimeout()-2*time.Millisecond
}
