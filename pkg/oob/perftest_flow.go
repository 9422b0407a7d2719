package oob

import (
	"context"
	"fmt"
)

// Verb is the operation a perftest benchmark measures (perftest's VerbType).
type Verb uint8

// Verbs in perftest's order (testsStr).
const (
	VerbSend Verb = iota
	VerbWrite
	VerbRead
	VerbAtomic
)

// String is the name perftest prints in its banner.
func (v Verb) String() string {
	switch v {
	case VerbSend:
		return "Send"
	case VerbWrite:
		return "RDMA_Write"
	case VerbRead:
		return "RDMA_Read"
	case VerbAtomic:
		return "Atomic"
	}
	return fmt.Sprintf("Verb(%d)", uint8(v))
}

// Test identifies a perftest benchmark (ib_<verb>_<bw|lat>) and knows the
// order of its out-of-band exchanges. Bidirectional (-b) runs are not
// modelled.
//
// The sequence, measured on perftest 4.5-0.17 captures (C = client writes,
// S = server answers, each line one symmetric exchange):
//
//	versions 16, cycle buffer 4, cache line 4, MTU 2           (Negotiate)
//	key 108 per QP                                             (Connect: addresses)
//	  ... both sides move their QPs to RTR/RTS ...             (Connect: callback)
//	key 108 x 2 (write/read/atomic bw) or x 3 (others)         (Connect: barriers)
//	  ... the test runs (a write/read/atomic bw server idles) ...
//	key 108, report 8+8+8+8+8       (write/read/atomic bw)     (Finish)
//	key 108, "done\0" each way      (all but ib_write_lat)     (Finish)
//	close                           (ib_write_lat: nothing sent)
//
// Only single-QP runs were captured; the per-QP address exchange for -q N
// follows perftest's source. ib_atomic_lat was not captured and is taken to
// behave like ib_read_lat. The write, read and atomic bandwidth tests make
// identical exchanges, so a server that cannot know which one a client runs
// (rxed serve) may use Test{Verb: VerbWrite} for all three; the client's key
// tells write (OutReads 1) from read/atomic (OutReads > 1).
type Test struct {
	Verb    Verb
	Latency bool // ib_*_lat rather than ib_*_bw
}

// String is the perftest program name, e.g. "ib_write_bw".
func (t Test) String() string {
	v := [...]string{"send", "write", "read", "atomic"}[t.Verb&3]
	if t.Latency {
		return "ib_" + v + "_lat"
	}
	return "ib_" + v + "_bw"
}

// Barriers is the number of key exchanges after the per-QP address
// exchange and before the test runs.
func (t Test) Barriers() int {
	if !t.Latency && t.Verb != VerbSend {
		return 2
	}
	return 3
}

// ExchangesReports tells whether the bandwidth reports are exchanged after
// the run: only write/read/atomic bandwidth tests, where the server does not
// measure and prints the client's figures.
func (t Test) ExchangesReports() bool { return !t.Latency && t.Verb != VerbSend }

// ServerIdles tells whether the server side takes no part in the run and
// waits in Finish while the client measures: write/read/atomic bandwidth
// tests and the read/atomic latency tests.
func (t Test) ServerIdles() bool {
	if t.Latency {
		return t.Verb == VerbRead || t.Verb == VerbAtomic
	}
	return t.Verb != VerbSend
}

// ClosesWithExchange tells whether the run ends with a final key exchange
// and "done" (everything except ib_write_lat, which just closes).
func (t Test) ClosesWithExchange() bool { return !(t.Latency && t.Verb == VerbWrite) }

// Connect runs the exchanges between Negotiate and the test run: one key
// exchange per QP (locals[i] against the peer's QP i), then connect(remotes)
// in which the caller moves its QPs to RTR/RTS and posts its receives, then
// the barriers. When Connect returns both sides are ready to run.
func (s *Session) Connect(ctx context.Context, t Test, locals []Key, connect func(remotes []Key) error) ([]Key, error) {
	if len(locals) == 0 {
		return nil, fmt.Errorf("oob: Connect needs at least one local key")
	}
	remotes := make([]Key, len(locals))
	for i, l := range locals {
		r, err := s.HandShake(ctx, l)
		if err != nil {
			return nil, err
		}
		remotes[i] = r
	}
	if connect != nil {
		if err := connect(remotes); err != nil {
			// Closing makes the peer's next read fail at once rather than
			// after its own timeout.
			_ = s.CloseWithoutExchange()
			return nil, errorf(s.s.peer, ErrConnect, "connecting our QPs failed: %v", err)
		}
	}
	for range t.Barriers() {
		if _, err := s.HandShake(ctx, locals[0]); err != nil {
			return nil, err
		}
	}
	return remotes, nil
}

// Finish runs the exchanges after the test and closes the session. For
// write/read/atomic bandwidth tests it exchanges the reports and returns the
// peer's (the server prints the client's); my is what this side reports
// (a server that did not measure may pass the zero value). When the server
// idles (ServerIdles) its wait for the client to finish the run is bounded
// by ctx alone (see AwaitHandShake), so give it a context that outlasts the
// run.
func (s *Session) Finish(ctx context.Context, t Test, local Key, my BWReport) (BWReport, error) {
	var remote BWReport
	// An idle server's first read waits for the client's whole run.
	bounded := !(s.role == Server && t.ServerIdles())
	if t.ExchangesReports() {
		_, err := s.handShake(ctx, local, "key message", bounded)
		bounded = true
		if err == nil {
			remote, err = s.ExchangeBWReports(ctx, my)
		}
		if err != nil {
			_ = s.CloseWithoutExchange()
			return BWReport{}, err
		}
	}
	if !t.ClosesWithExchange() {
		return remote, s.CloseWithoutExchange()
	}
	return remote, s.close(ctx, local, bounded)
}
