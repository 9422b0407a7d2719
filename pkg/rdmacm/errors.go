package rdmacm

import (
	"errors"
	"fmt"

	"github.com/rxed/rxed/pkg/wire/mad"
)

// RejectError is a connection the peer refused (RDMA_CM_EVENT_REJECTED):
// the REJ's reason and its private data (NVMe-oF, for one, puts its status
// there). Use errors.As.
type RejectError struct {
	Reason      mad.REJReason
	PrivateData []byte
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("rejected: %v (%d)", e.Reason, uint16(e.Reason))
}

// SIDRError is a UD service resolution the peer answered with a status
// other than success (no listener: unsupported service).
type SIDRError struct {
	Status mad.SIDRStatus
}

func (e *SIDRError) Error() string {
	return fmt.Sprintf("SIDR: %v (%d)", e.Status, uint8(e.Status))
}

var (
	// ErrTimeout: the peer never answered the CM's retransmitted request
	// (RDMA_CM_EVENT_UNREACHABLE, or REJ 4 timeout).
	ErrTimeout = errors.New("rdmacm: no answer from the peer (CM timeout)")
	// ErrClosed: the listener was closed.
	ErrClosed = errors.New("rdmacm: listener closed")
	// ErrDisconnected: the peer disconnected (its DREQ), or Disconnect
	// was called.
	ErrDisconnected = errors.New("rdmacm: disconnected")
	// ErrAddrInUse: another listener has the address and port.
	ErrAddrInUse = errors.New("rdmacm: address already in use")
	// ErrRejected: the request was rejected by Request.Reject.
	ErrRejected = errors.New("rdmacm: rejected by the application")
	// ErrAnswered: Accept or Reject on a request already answered.
	ErrAnswered = errors.New("rdmacm: request already answered")
)
