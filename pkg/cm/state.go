package cm

// State is a connection's CM state, named as ib_cm_state in cm.c (IBA
// 12.9.6 draws the same machine).
type State int

const (
	StateIdle State = iota
	StateListen
	StateREQSent
	StateREQRcvd
	StateMRAREQSent
	StateMRAREQRcvd
	StateREPSent
	StateREPRcvd
	StateMRAREPSent
	StateMRAREPRcvd
	StateEstablished
	StateDREQSent
	StateDREQRcvd
	StateTimewait
	StateSIDRREQSent
	StateSIDRREQRcvd
)

var stateNames = [...]string{
	StateIdle:        "IDLE",
	StateListen:      "LISTEN",
	StateREQSent:     "REQ_SENT",
	StateREQRcvd:     "REQ_RCVD",
	StateMRAREQSent:  "MRA_REQ_SENT",
	StateMRAREQRcvd:  "MRA_REQ_RCVD",
	StateREPSent:     "REP_SENT",
	StateREPRcvd:     "REP_RCVD",
	StateMRAREPSent:  "MRA_REP_SENT",
	StateMRAREPRcvd:  "MRA_REP_RCVD",
	StateEstablished: "ESTABLISHED",
	StateDREQSent:    "DREQ_SENT",
	StateDREQRcvd:    "DREQ_RCVD",
	StateTimewait:    "TIMEWAIT",
	StateSIDRREQSent: "SIDR_REQ_SENT",
	StateSIDRREQRcvd: "SIDR_REQ_RCVD",
}

func (s State) String() string {
	if s >= 0 && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "State(?)"
}

// halfOpen reports whether a passive connection in s counts against
// Config.MaxHalfOpen: a REQ has been received and no RTU yet.
func (s State) halfOpen() bool {
	switch s {
	case StateREQRcvd, StateMRAREQSent, StateREPSent, StateMRAREPRcvd, StateSIDRREQRcvd:
		return true
	}
	return false
}
