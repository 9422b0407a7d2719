package conform

import (
	"context"
	"fmt"
	"net/netip"
	"runtime/debug"
	"time"
)

// closeGrace bounds the closing exchange after a scenario's verdict.
const closeGrace = 8 * time.Second

// bodyGrace is how long past its deadline a scenario body gets to return
// (one that honours its context returns within it, with its verdict),
// and then again after the runner closed its connection.
const bodyGrace = time.Second

// bodyDone is what a scenario body's goroutine hands back.
type bodyDone struct {
	out  Outcome
	conn *Conn
}

// runBody sets up the scenario's connection through sc and runs it,
// reporting on ch (buffered: a body the runner stopped waiting for never
// blocks).
func runBody(ctx context.Context, cfg *Config, s *Scenario, sc *scope, ch chan<- bodyDone) {
	var c *Conn
	defer func() {
		if p := recover(); p != nil {
			ch <- bodyDone{Errorf("scenario panicked: %v (%s)", p, firstFrame(debug.Stack())), c}
		}
	}()
	var err error
	if cfg.Serve {
		c, err = accept(ctx, cfg, s.Conn, sc)
	} else {
		c, err = dial(ctx, cfg, s.Conn, sc)
	}
	if err != nil {
		ch <- bodyDone{Errorf("setup: %v", err), nil}
		return
	}
	ch <- bodyDone{s.run(ctx, c), c}
}

// awaitOverrun runs when the scenario's context has ended and its body
// has not returned. The exchange's listener is closed at once (the accept
// phase is over either way, and its port is the next scenario's); a body
// that honours its context then returns within bodyGrace and its verdict
// stands. Otherwise the runner closes the session, the link and the
// tool's waiter (which unblocks a body stuck on them), waits bodyGrace
// more, and reports the overrun as an ERROR: nothing the body concludes
// after its connection was taken from it is a statement about the peer.
func awaitOverrun(cfg *Config, sc *scope, ch <-chan bodyDone) bodyDone {
	sc.expire()
	t := time.NewTimer(bodyGrace)
	defer t.Stop()
	select {
	case d := <-ch:
		return d
	case <-t.C:
	}
	sc.end()
	out := Errorf("deadline exceeded: the scenario did not end within its %v deadline; the runner closed its connection", cfg.Timeout)
	t.Reset(bodyGrace)
	select {
	case late := <-ch:
		out.Evidence += "; it then returned " + late.out.Verdict.String() + ": " + late.out.Evidence
	case <-t.C:
		out.Evidence += fmt.Sprintf("; its body did not return within %v more and was abandoned", bodyGrace)
	}
	return bodyDone{out: out}
}

// Run runs one scenario on a fresh connection within cfg.Timeout and
// returns its result. It never panics and never outlives the deadline by
// more than the closing exchange's bound.
func Run(ctx context.Context, cfg Config, s *Scenario) (res Result) {
	cfg.defaults()
	res = Result{ID: s.ID, Title: s.Title, Rule: s.Rule, Tool: cfg.Tool,
		Local: netip.AddrPortFrom(cfg.Local, cfg.RoCEPort).String(), Peer: netip.AddrPortFrom(cfg.Peer, cfg.RoCEPort).String()}
	start := time.Now()
	defer func() { res.Elapsed = time.Since(start) }()
	switch {
	case !s.Reaches(cfg.Tool):
		res.Verdict, res.Evidence = Skip, fmt.Sprintf("%s cannot reach this case (needs %s)", cfg.Tool, toolList(s.Tools))
		return res
	case (s.Role == PeerRequester) != cfg.Serve:
		want := "--serve (the peer as requester)"
		if s.Role == PeerResponder {
			want = "the peer's tool as server (without --serve)"
		}
		res.Verdict, res.Evidence = Skip, "needs "+want
		return res
	}
	sctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	// The scenario's listener, session, link and tool waiter belong to
	// the runner: whatever the body does, they are closed before Run
	// returns, so the next scenario finds its ports free.
	sc := &scope{}
	defer sc.end()
	ch := make(chan bodyDone, 1)
	go runBody(sctx, &cfg, s, sc, ch)
	var d bodyDone
	select {
	case d = <-ch:
	case <-sctx.Done():
		d = awaitOverrun(&cfg, sc, ch)
	}
	res.Verdict, res.Evidence = d.out.Verdict, d.out.Evidence
	if d.conn == nil {
		if l := sc.scenarioLink(); l != nil {
			// an overrun: the trace up to the runner's closing
			res.Trace = l.Trace()
			res.Local, res.Peer = l.flow.Src.String(), l.flow.Dst.String()
		}
	} else {
		cctx, ccancel := context.WithTimeout(ctx, closeGrace)
		if err := d.conn.Close(cctx); err != nil {
			cfg.Logger.Debug("closing the tool's exchange", "scenario", s.ID, "err", err)
		}
		ccancel()
		res.Trace = d.conn.Trace()
		if d.conn.Link != nil {
			// requester mode learns the peer's address from its client
			res.Local, res.Peer = d.conn.flow.Src.String(), d.conn.flow.Dst.String()
		}
	}
	return res
}

// RunAll runs scenarios in order, calling each (if not nil) with every
// result as it is known.
func RunAll(ctx context.Context, cfg Config, scenarios []*Scenario, each func(Result)) []Result {
	var out []Result
	for _, s := range scenarios {
		if ctx.Err() != nil {
			break
		}
		r := Run(ctx, cfg, s)
		out = append(out, r)
		if each != nil {
			each(r)
		}
	}
	return out
}

func toolList(ts []Tool) string {
	s := ""
	for i, t := range ts {
		if i > 0 {
			s += " or "
		}
		s += string(t)
	}
	return s
}

// firstFrame picks the panicking line out of a stack dump.
func firstFrame(stack []byte) string {
	lines := 0
	start := 0
	for i, b := range stack {
		if b == '\n' {
			lines++
			if lines == 7 {
				start = i + 1
			}
			if lines == 8 {
				return string(stack[start:i])
			}
		}
	}
	return ""
}
