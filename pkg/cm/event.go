package cm

import (
	"errors"

	"github.com/rxed/rxed/pkg/wire/mad"
)

// EventType says what happened to a connection.
type EventType int

const (
	// EventREQ (passive): a REQ created the ID. Event.REQ is the
	// message; answer with ID.Accept or ID.Reject (or ID.Destroy).
	EventREQ EventType = iota + 1
	// EventREP (active): the REP arrived. Event.REP is the message. Move
	// the QP to RTR/RTS and call ID.SendRTU, unless ConnectParams.AutoRTU
	// (then EventEstablished follows at once).
	EventREP
	// EventEstablished: the ID entered ESTABLISHED (active: RTU sent;
	// passive: RTU received, ID.Established called, or a DREQ arrived
	// before the RTU: EventDREQ follows). PrivateData is the RTU's on the
	// passive side when the RTU brought it.
	EventEstablished
	// EventREJ: the peer rejected. Reason, ARI, PrivateData from the REJ.
	EventREJ
	// EventTimeout: the REQ (active) or REP (passive) was sent
	// 1+MaxCMRetries times with no answer. Reason is REJTimeout, Err
	// ErrTimeout. The ID is gone (IDLE).
	EventTimeout
	// EventMRA: the peer asked for more time; the wait was extended by
	// ServiceTimeout.
	EventMRA
	// EventDREQ: the peer disconnected (a DREQ arrived, also when it
	// crossed our own: then EventCrossedDREP may follow). The Manager has
	// answered with a DREP; the ID is in TIMEWAIT.
	EventDREQ
	// EventDisconnected: our DREQ was answered by a DREP (Err nil) or went
	// unanswered (Err ErrTimeout); the ID is in TIMEWAIT.
	EventDisconnected
	// EventTimewaitExit: timewait is over; the ID is gone.
	EventTimewaitExit
	// EventSIDRREQ (passive): a SIDR_REQ arrived; Event.SIDRREQ is the
	// message. Answer with ID.SIDRReply (or ID.Destroy: status REJECT).
	EventSIDRREQ
	// EventCrossedDREP: after crossed DREQs (EventDREQ came while our
	// DREQ was unanswered), the DREP to our DREQ arrived, in TIMEWAIT.
	// The peer had our DREQ, so its own DREQ is cancelled and will not be
	// retried: nothing more is owed to it, though the ID stays in
	// TIMEWAIT until EventTimewaitExit. At most once per ID, never after
	// EventDisconnected; cm.c drops this DREP without an event.
	// PrivateData is the DREP's.
	EventCrossedDREP
)

var eventNames = [...]string{
	EventREQ:          "REQ",
	EventREP:          "REP",
	EventEstablished:  "ESTABLISHED",
	EventREJ:          "REJ",
	EventTimeout:      "TIMEOUT",
	EventMRA:          "MRA",
	EventDREQ:         "DREQ",
	EventDisconnected: "DISCONNECTED",
	EventTimewaitExit: "TIMEWAIT_EXIT",
	EventSIDRREQ:      "SIDR_REQ",
	EventCrossedDREP:  "CROSSED_DREP",
}

func (t EventType) String() string {
	if t > 0 && int(t) < len(eventNames) {
		return eventNames[t]
	}
	return "EventType(?)"
}

// Event is one thing that happened to a connection. Messages and slices in
// it belong to the receiver.
type Event struct {
	Type EventType
	ID   *ID

	REQ     *mad.REQ     // EventREQ
	REP     *mad.REP     // EventREP
	SIDRREQ *mad.SIDRREQ // EventSIDRREQ

	Reason         mad.REJReason // EventREJ; REJTimeout for EventTimeout
	ARI            []byte        // EventREJ
	ServiceTimeout uint8         // EventMRA (IBA time value)

	// PrivateData is the private data area of the message behind the
	// event (REQ, REP, RTU, REJ, MRA, DREQ, DREP, SIDR_REQ), whole as on
	// the wire (the wire carries no length).
	PrivateData []byte

	// Err is ErrTimeout for EventTimeout and for an unanswered DREQ.
	Err error
}

// Handler receives a connection's events. See Manager for the goroutine
// that calls it.
type Handler func(Event)

// SIDRResult is the outcome of a SIDRQuery.
type SIDRResult struct {
	// Err is nil when a SIDR_REP arrived (look at Status), ErrTimeout when
	// none did.
	Err           error
	Status        mad.SIDRStatus
	QPN           uint32
	QKey          uint32
	ServiceID     uint64
	ClassPortInfo []byte
	PrivateData   []byte
}

// SIDRHandler receives the outcome of a SIDRQuery, once.
type SIDRHandler func(SIDRResult)

var (
	// ErrTimeout: a message was sent 1+MaxCMRetries times without an answer.
	ErrTimeout = errors.New("cm: timed out")
	// ErrState: the call is not valid in the ID's current state (or the
	// ID is gone).
	ErrState = errors.New("cm: invalid state")
	// ErrAlreadyEstablished: ID.Established on an established ID
	// (cm_establish's -EISCONN); nothing was done.
	ErrAlreadyEstablished = errors.New("cm: already established")
	// ErrBusy: a listener already covers the service ID.
	ErrBusy = errors.New("cm: service ID in use")
	// ErrClosed: the Manager is closed.
	ErrClosed = errors.New("cm: manager closed")
	// ErrInvalid: a parameter does not fit the wire format.
	ErrInvalid = errors.New("cm: invalid parameter")
)
