package conform

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
)

// Role says which end the peer plays in a scenario.
type Role uint8

const (
	// PeerResponder: the engine requests, the peer's tool is the server.
	PeerResponder Role = iota
	// PeerRequester: the engine plays the server (Config.Serve), the
	// peer's client requests.
	PeerRequester
)

func (r Role) String() string {
	if r == PeerRequester {
		return "requester"
	}
	return "responder"
}

// Scenario is one scripted check of one rule.
type Scenario struct {
	ID     string
	Title  string
	Rule   string // IBA section / compliance statement
	Expect string // what the rule requires of the peer
	Role   Role
	// Tools are the peer tools that can reach the case; others are SKIP.
	Tools []Tool
	// Conn configures the scenario's fresh connection.
	Conn ConnOptions
	// Run drives the scenario on its connection; it must honour ctx.
	Run func(ctx context.Context, c *Conn) Outcome
}

// run runs the scenario's body on c; a FAIL's evidence then names the
// peer's packets the link dropped and why (a bad ICRC, another P_Key,
// malformed), which the body's "no ACK within ..." does not say.
func (s *Scenario) run(ctx context.Context, c *Conn) Outcome {
	o := s.Run(ctx, c)
	if o.Verdict == Fail && c.Link != nil {
		if d := droppedEvidence(c.Trace()); d != "" {
			o.Evidence += "; " + d
		}
	}
	return o
}

// Reaches reports whether tool t can reach the scenario.
func (s *Scenario) Reaches(t Tool) bool { return slices.Contains(s.Tools, t) }

var registry []*Scenario

func add(s *Scenario) {
	for _, o := range registry {
		if o.ID == s.ID {
			panic("conform: duplicate scenario " + s.ID)
		}
	}
	registry = append(registry, s)
}

// All returns every scenario, ordered by ID.
func All() []*Scenario {
	out := append([]*Scenario(nil), registry...)
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Select returns the scenarios whose ID matches re (nil: all).
func Select(re *regexp.Regexp) []*Scenario {
	var out []*Scenario
	for _, s := range All() {
		if re == nil || re.MatchString(s.ID) {
			out = append(out, s)
		}
	}
	return out
}

// Lookup returns the scenario with this ID.
func Lookup(id string) (*Scenario, error) {
	for _, s := range registry {
		if s.ID == id {
			return s, nil
		}
	}
	return nil, fmt.Errorf("conform: no scenario %q", id)
}

// Sets of tools.
var (
	rcTools    = []Tool{IBWriteBW, IBReadBW, IBAtomicBW, IBSendBW, IBVRCPingpong}
	rdmaTools  = []Tool{IBWriteBW, IBReadBW, IBAtomicBW}
	sendTools  = []Tool{IBSendBW, IBVRCPingpong}
	writeTools = []Tool{IBWriteBW}
	readTools  = []Tool{IBReadBW}
	atomTools  = []Tool{IBAtomicBW}
	udTools    = []Tool{IBVUDPingpong}
	anyTools   = []Tool{IBWriteBW, IBReadBW, IBAtomicBW, IBSendBW, IBVRCPingpong, IBVUDPingpong}
)
