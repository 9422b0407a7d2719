package ib

import (
	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
)

// Sentinel errors of the verbs, re-exported from pkg/qp and pkg/mr so a
// program needs only this package to tell them apart with errors.Is. The
// errors returned carry details (the offending value, the limit, the
// attribute); a refused post is a *PostError wrapping one of them.
var (
	// ErrQPState: the QP's state does not allow the operation (posting
	// sends before RTS, posting receives in RESET).
	ErrQPState = qp.ErrQPState
	// ErrSendFull: the send queue holds max_send_wr outstanding requests.
	ErrSendFull = qp.ErrSendFull
	// ErrRecvFull: the receive queue or SRQ holds max_wr requests.
	ErrRecvFull = qp.ErrQueueFull
	// ErrTooManySGE: a work request has more SGEs than the queue allows.
	ErrTooManySGE = qp.ErrTooManySGE
	// ErrInlineTooLong: inline data exceeds max_inline_data.
	ErrInlineTooLong = qp.ErrInlineTooLong
	// ErrInlineOpcode: inline data on an opcode that cannot carry it.
	ErrInlineOpcode = qp.ErrInlineOpcode
	// ErrBadOpcode: the opcode is not supported on the QP's type.
	ErrBadOpcode = qp.ErrBadOpcode
	// ErrBadSendFlags: unknown or unsupported send flags.
	ErrBadSendFlags = qp.ErrBadFlags
	// ErrMsgTooLong: the message exceeds the largest message (or a UD
	// message one MTU).
	ErrMsgTooLong = qp.ErrMsgTooLong
	// ErrAtomicAlign: an atomic's remote address is not 8-byte aligned.
	ErrAtomicAlign = qp.ErrAtomicAlign
	// ErrAtomicSGE: an atomic's local SGEs hold fewer than the 8 bytes
	// of its result (rxe's validate_send_wr).
	ErrAtomicSGE = qp.ErrAtomicSGE
	// ErrNoUDDest: a UD send without an address handle.
	ErrNoUDDest = qp.ErrNoUDDest
	// ErrCQSize: a CQ size outside 1..MaxCQE.
	ErrCQSize = qp.ErrCQSize
	// ErrCQOverflow: the CQ was full when a completion came, which was
	// lost (CQ.PollCQ and CQ.WaitPoll return it once the CQ is empty).
	ErrCQOverflow = qp.ErrCQOverflow
	// ErrCapRange: CreateQP asked for more than the device allows
	// (max_send_wr, max_recv_wr, max_send_sge, max_recv_sge or
	// max_inline_data above QueryDevice's; rxe_qp_chk_cap's EINVAL).
	ErrCapRange = qp.ErrCapRange
	// ErrBadQPType: CreateQP of a type other than RC, UC, UD and GSI
	// (rxe_qp_chk_init's EOPNOTSUPP).
	ErrBadQPType = qp.ErrBadQPType
	// ErrSRQSize: CreateSRQ's max_wr outside 1..MaxSRQWR or max_sge above
	// MaxSRQSGE (rxe_srq_chk_init's EINVAL); SRQ.Modify's max_wr outside
	// 1..MaxSRQWR, below the armed limit (rxe_srq_chk_attr's EINVAL) or
	// below the receives queued (rxe_queue_resize's EINVAL).
	ErrSRQSize = qp.ErrQueueSize
	// ErrSRQLimit: an SRQ limit below 0, or above max_wr when armed
	// (ArmLimit, SRQ.Modify; rxe_srq_chk_attr's EINVAL).
	ErrSRQLimit = qp.ErrSRQLimit
	// ErrInvalidArgument: an argument no object can take, such as a
	// memory window type other than 1 and 2.
	ErrInvalidArgument = mr.ErrInvalidArgument
	// ErrInvalidTransition: a rejected ibv_modify_qp whose state change
	// is not allowed. Every rejected modify is a *ModifyError naming the
	// offending attribute and matching one of ErrInvalidTransition,
	// ErrMissingAttr, ErrAttrNotAllowed, ErrAttrValue,
	// ErrCurStateMismatch or ErrSQDraining.
	ErrInvalidTransition = qp.ErrInvalidTransition
	// ErrMissingAttr: a required attribute of the transition is not in
	// the mask.
	ErrMissingAttr = qp.ErrMissingAttr
	// ErrAttrNotAllowed: the mask has an attribute the transition does
	// not accept.
	ErrAttrNotAllowed = qp.ErrAttrNotAllowed
	// ErrAttrValue: an attribute value is out of range.
	ErrAttrValue = qp.ErrAttrValue
	// ErrCurStateMismatch: IBV_QP_CUR_STATE names another state than the
	// QP's.
	ErrCurStateMismatch = qp.ErrCurStateMismatch
	// ErrEmptyBuffer: a memory region must cover at least one byte.
	ErrEmptyBuffer = mr.ErrEmptyBuffer
	// ErrAccessCombo: REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE.
	ErrAccessCombo = mr.ErrAccessCombo
	// ErrUnsupportedAccess: an access flag the object does not support.
	ErrUnsupportedAccess = mr.ErrUnsupportedAccess
	// ErrPDBusy: PD.Dealloc while regions, windows, QPs or SRQs use it.
	ErrPDBusy = mr.ErrPDBusy
	// ErrBadPD: the PD was deallocated or belongs to another device.
	ErrBadPD = mr.ErrBadPD
	// ErrMWBound: a region with bound memory windows cannot be
	// deregistered.
	ErrMWBound = mr.ErrMWBound
)

// ModifyError explains a rejected QP.Modify: the transition, the QP type
// and the offending IBV_QP_* attribute (errors.As finds it).
type ModifyError = qp.ModifyError
