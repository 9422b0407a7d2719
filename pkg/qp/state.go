package qp

import "strconv"

// State is a QP state, numbered like enum ibv_qp_state.
type State int

// QP states (IBA 10.3.1).
const (
	Reset State = iota // IBV_QPS_RESET
	Init               // IBV_QPS_INIT
	RTR                // IBV_QPS_RTR: ready to receive
	RTS                // IBV_QPS_RTS: ready to send
	SQD                // IBV_QPS_SQD: send queue drain(ed/ing)
	SQE                // IBV_QPS_SQE: send queue error (UC, UD, GSI only)
	Err                // IBV_QPS_ERR
)

var stateNames = [...]string{
	Reset: "RESET",
	Init:  "INIT",
	RTR:   "RTR",
	RTS:   "RTS",
	SQD:   "SQD",
	SQE:   "SQE",
	Err:   "ERR",
}

// Valid reports whether s is one of the seven QP states.
func (s State) Valid() bool { return s >= Reset && s <= Err }

// String returns the libibverbs name without prefix, e.g. "RTS".
func (s State) String() string {
	if s.Valid() {
		return stateNames[s]
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// CanPostSend reports whether a send WR may be posted in state s, as
// rxe_post_send allows: RTS and after (SQD queues it, SQE and ERR flush it
// with WR_FLUSH_ERR).
func (s State) CanPostSend() bool { return s >= RTS && s <= Err }

// CanPostRecv reports whether a receive WR may be posted in state s, as
// rxe_post_recv allows: anything but RESET (in ERR it is flushed).
func (s State) CanPostRecv() bool { return s >= Init && s <= Err }
