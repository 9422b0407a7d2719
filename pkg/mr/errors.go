package mr

import (
	"errors"
	"fmt"
)

// Data-path errors, returned bare (never wrapped) by Lookup so that the hot
// path does not allocate; compare with == or errors.Is.
var (
	// ErrInvalidKey: no live region or window has this key (unknown index,
	// stale key part, wrong key kind).
	ErrInvalidKey = errors.New("mr: invalid key")
	// ErrPDMismatch: the object belongs to another protection domain.
	ErrPDMismatch = errors.New("mr: protection domain mismatch")
	// ErrAccess: the object does not grant the access the operation needs.
	ErrAccess = errors.New("mr: access not permitted")
	// ErrRange: the access is not inside the region or window.
	ErrRange = errors.New("mr: access out of range")
	// ErrAlign: an atomic's address is not 8-byte aligned.
	ErrAlign = errors.New("mr: atomic address not 8-byte aligned")
	// ErrInvalidated: the key names a fast-registration region or a window
	// that is currently invalid (free/unbound).
	ErrInvalidated = errors.New("mr: key invalidated")
)

// Control-path errors. They are returned wrapped with details; test with
// errors.Is.
var (
	// ErrEmptyBuffer: a region must cover at least one byte.
	ErrEmptyBuffer = errors.New("mr: empty buffer")
	// ErrAccessCombo: REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE.
	ErrAccessCombo = errors.New("mr: remote write/atomic access requires local write")
	// ErrUnsupportedAccess: a flag that is not allowed for this object.
	ErrUnsupportedAccess = errors.New("mr: unsupported access flags")
	// ErrIOVAOverflow: [iova, iova+length) would wrap past 2^64.
	ErrIOVAOverflow = errors.New("mr: iova range overflows")
	// ErrBadPD: nil PD, a deallocated PD or a PD of another table.
	ErrBadPD = errors.New("mr: invalid protection domain")
	// ErrPDBusy: the PD still has regions, windows or other holders.
	ErrPDBusy = errors.New("mr: protection domain in use")
	// ErrMWBound: the region has windows bound to it (rxe refuses dereg,
	// rereg and invalidation then).
	ErrMWBound = errors.New("mr: memory windows are bound to the region")
	// ErrDeregistered: the region or window was already deregistered or
	// deallocated.
	ErrDeregistered = errors.New("mr: object already deregistered")
	// ErrNoResources: the key table is full.
	ErrNoResources = errors.New("mr: out of keys")
	// ErrBadState: the object is in the wrong state for the operation (e.g.
	// REG_MR on a valid region, binding a bound type 2 window, invalidating
	// a user region or a type 1 window).
	ErrBadState = errors.New("mr: object in wrong state for operation")
	// ErrKeyMismatch: a key given with a work request does not name the
	// object (fast registration with another index, invalidating with a
	// stale key).
	ErrKeyMismatch = errors.New("mr: key does not match object")
	// ErrBind: a memory window bind violates the IBA bind rules.
	ErrBind = errors.New("mr: memory window bind rejected")
	// ErrBadQP: a type 2 window used from a QP it is not bound to.
	ErrBadQP = errors.New("mr: window not associated with this QP")
	// ErrMappingBusy: a mapping still has regions registered over it.
	ErrMappingBusy = errors.New("mr: mapping in use by memory regions")
	// ErrMappingClosed: the mapping was closed.
	ErrMappingClosed = errors.New("mr: mapping closed")
	// ErrFileTooSmall: the file is smaller than the requested mapping.
	ErrFileTooSmall = errors.New("mr: file smaller than requested mapping")
	// ErrInvalidArgument: a malformed request (unknown flags, nil objects).
	ErrInvalidArgument = errors.New("mr: invalid argument")
	// ErrNotInMapping: a buffer said to come from a mapping lies outside it.
	ErrNotInMapping = errors.New("mr: buffer not inside mapping")
	// ErrNotFastMR: Map of a region that is not a fast-registration one.
	ErrNotFastMR = errors.New("mr: not a fast-registration region")
	// ErrMapTooBig: Map of more than the region's MaxLen bytes, or a
	// REG_MR of more than was mapped.
	ErrMapTooBig = errors.New("mr: buffer larger than the region's maximum length")
)

func wrapf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}

// Work completion statuses (IBV_WC_* values) the mappings below produce.
// pkg/qp's WCStatus has the same values.
const (
	StatusSuccess      uint32 = 0  // IBV_WC_SUCCESS
	StatusLocQPOpErr   uint32 = 2  // IBV_WC_LOC_QP_OP_ERR: failed REG_MR / LOCAL_INV
	StatusLocProtErr   uint32 = 4  // IBV_WC_LOC_PROT_ERR: bad lkey / SGE
	StatusMWBindErr    uint32 = 6  // IBV_WC_MW_BIND_ERR: failed BIND_MW
	StatusRemInvReqErr uint32 = 9  // IBV_WC_REM_INV_REQ_ERR
	StatusRemAccessErr uint32 = 10 // IBV_WC_REM_ACCESS_ERR
)

// AETH NAK codes (same values as pkg/wire's NAK codes).
const (
	NAKInvalidRequest uint8 = 1
	NAKRemoteAccess   uint8 = 2
)

// LocalStatus is the completion status of a work request whose local
// (lkey) lookup failed with err: LOC_PROT_ERR for every lookup error, as
// rxe's copy_data failures. nil maps to SUCCESS.
func LocalStatus(err error) uint32 {
	if err == nil {
		return StatusSuccess
	}
	return StatusLocProtErr
}

// RemoteNAK is the NAK code an RC responder sends when a remote (rkey)
// lookup failed with err: a misaligned atomic is an invalid request
// (RESPST_ERR_MISALIGNED_ATOMIC), everything else is a remote access error
// (RESPST_ERR_RKEY_VIOLATION). It returns 0 for nil.
func RemoteNAK(err error) uint8 {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrAlign):
		return NAKInvalidRequest
	default:
		return NAKRemoteAccess
	}
}

// RemoteStatus is the completion status both ends report for a remote
// lookup failure err (the responder's own WC and the requester's WC after
// the NAK): REM_INV_REQ_ERR for misaligned atomics, else REM_ACCESS_ERR.
func RemoteStatus(err error) uint32 {
	switch RemoteNAK(err) {
	case 0:
		return StatusSuccess
	case NAKInvalidRequest:
		return StatusRemInvReqErr
	default:
		return StatusRemAccessErr
	}
}

// RemoteInvalidateStatus is the responder's completion status when a
// SEND_WITH_INV's invalidation fails (rxe: RESPST_ERR_INVALIDATE_RKEY, class
// J: no NAK, the QP moves to the error state).
func RemoteInvalidateStatus(err error) uint32 {
	if err == nil {
		return StatusSuccess
	}
	return StatusRemInvReqErr
}
