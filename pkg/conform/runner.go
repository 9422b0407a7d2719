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
	type done struct {
		out  Outcome
		conn *Conn
	}
	ch := make(chan done, 1)
	go func() {
		var c *Conn
		defer func() {
			if p := recover(); p != nil {
				ch <- done{Errorf("scenario panicked: %v (%s)", p, firstFrame(debug.Stack())), c}
			}
		}()
		var err error
		if cfg.Serve {
			c, err = Accept(sctx, &cfg, s.Conn)
		} else {
			c, err = Dial(sctx, &cfg, s.Conn)
		}
		if err != nil {
			ch <- done{Errorf("setup: %v", err), nil}
			return
		}
		ch <- done{s.Run(sctx, c), c}
	}()
	var d done
	select {
	case d = <-ch:
	case <-time.After(cfg.Timeout + time.Second):
		// The run function ignored its context: report, and let it end
		// on its own (its link is closed below when it returns).
		d = done{out: Errorf("scenario did not end within its %v deadline", cfg.Timeout)}
		go func() {
			if late := <-ch; late.conn != nil {
				_ = late.conn.Close(context.Background())
			}
		}()
	}
	res.Verdict, res.Evidence = d.out.Verdict, d.out.Evidence
	if d.conn != nil {
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
