package conform

import (
	"encoding/json"
	"fmt"
	"time"
)

// Verdict is the outcome of one scenario.
type Verdict uint8

// Verdicts, best first.
const (
	// Pass: the peer did what the rule requires.
	Pass Verdict = iota
	// Deviation: IBA allows a choice and the peer made another one than
	// the scenario names (or a documented, tolerated divergence).
	Deviation
	// Skip: the peer's tool cannot reach the case (or the peer's setup
	// makes it unreachable, e.g. its memory grants the access a scenario
	// wants refused).
	Skip
	// Fail: the peer broke the rule; the evidence names the packets.
	Fail
	// Error: the scenario could not run (exchange failed, peer gone,
	// deadline): no statement about the rule.
	Error
)

var verdictNames = [...]string{"PASS", "DEVIATION", "SKIP", "FAIL", "ERROR"}

// String is the upper-case name printed in tables.
func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return fmt.Sprintf("Verdict(%d)", uint8(v))
}

// MarshalText makes JSON records carry the name.
func (v Verdict) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText parses a name.
func (v *Verdict) UnmarshalText(b []byte) error {
	for i, n := range verdictNames {
		if n == string(b) {
			*v = Verdict(i)
			return nil
		}
	}
	return fmt.Errorf("conform: unknown verdict %q", b)
}

// Outcome is what a scenario's run function returns.
type Outcome struct {
	Verdict  Verdict
	Evidence string
}

// Passf and the others build an Outcome with formatted evidence.
func Passf(format string, a ...any) Outcome { return Outcome{Pass, fmt.Sprintf(format, a...)} }

// Failf is a FAIL outcome.
func Failf(format string, a ...any) Outcome { return Outcome{Fail, fmt.Sprintf(format, a...)} }

// Deviationf is a DEVIATION outcome.
func Deviationf(format string, a ...any) Outcome {
	return Outcome{Deviation, fmt.Sprintf(format, a...)}
}

// Skipf is a SKIP outcome.
func Skipf(format string, a ...any) Outcome { return Outcome{Skip, fmt.Sprintf(format, a...)} }

// Errorf is an ERROR outcome.
func Errorf(format string, a ...any) Outcome { return Outcome{Error, fmt.Sprintf(format, a...)} }

// Result is one scenario's record: the -json output's element.
type Result struct {
	ID       string        `json:"id"`
	Title    string        `json:"title"`
	Rule     string        `json:"rule"`
	Tool     Tool          `json:"tool"`
	Verdict  Verdict       `json:"verdict"`
	Evidence string        `json:"evidence"`
	Elapsed  time.Duration `json:"elapsed_ns"`
	// Trace is every packet of the scenario, both ways, in order.
	Trace []Event `json:"-"`
	// Local and Peer name the two ends of the ladder.
	Local string `json:"local,omitempty"`
	Peer  string `json:"peer,omitempty"`
}

// MarshalJSON adds the trace length (the trace itself goes to pcap and the
// report).
func (r Result) MarshalJSON() ([]byte, error) {
	type plain Result
	return json.Marshal(struct {
		plain
		Packets int `json:"packets"`
	}{plain(r), len(r.Trace)})
}
