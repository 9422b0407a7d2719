package qp

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/rxed/rxed/pkg/wire"
)

// Sentinel kinds of ModifyError, for errors.Is.
var (
	ErrInvalidTransition = errors.New("invalid QP state transition")
	ErrMissingAttr       = errors.New("required QP attribute missing")
	ErrAttrNotAllowed    = errors.New("QP attribute not allowed in this transition")
	ErrAttrValue         = errors.New("QP attribute value out of range")
	ErrCurStateMismatch  = errors.New("IBV_QP_CUR_STATE does not match the QP state")
	ErrBadQPType         = errors.New("invalid QP type")
	// ErrSQDraining: a QP in SQD may move only to ERR until its send
	// queue has drained (Attr.SQDraining false, or the SQ-drained event).
	ErrSQDraining = errors.New("send queue still draining")
)

// ModifyError explains why a modify was rejected. Attr is the offending
// IBV_QP_* bit (0 when the transition itself is at fault); Kind is one of
// the Err* sentinels above and is what errors.Is matches.
type ModifyError struct {
	Type     Type
	From, To State
	Attr     AttrMask
	Kind     error
	Detail   string // value problems: what was wrong with it
}

// Error names the transition, the QP type and the offending attribute,
// e.g. "qp: INIT->RTR on RC requires IBV_QP_DEST_QPN".
func (e *ModifyError) Error() string {
	tr := fmt.Sprintf("%v->%v on %v", e.From, e.To, e.Type)
	switch e.Kind {
	case ErrInvalidTransition:
		return fmt.Sprintf("qp: %v->%v is not a valid transition for %v", e.From, e.To, e.Type)
	case ErrMissingAttr:
		return fmt.Sprintf("qp: %s requires %v", tr, e.Attr)
	case ErrAttrNotAllowed:
		return fmt.Sprintf("qp: %s does not allow %v", tr, e.Attr)
	case ErrBadQPType:
		return fmt.Sprintf("qp: invalid QP type %v", e.Type)
	case ErrSQDraining:
		return fmt.Sprintf("qp: %s refused: the send queue is still draining (only ERR may interrupt it)", tr)
	}
	return fmt.Sprintf("qp: %s: %v %s", tr, e.Attr, e.Detail)
}

// Unwrap returns Kind.
func (e *ModifyError) Unwrap() error { return e.Kind }

// transition holds the attribute masks of one state change per QP type:
// req must all be present, opt may be; IBV_QP_STATE is always allowed.
type transition struct {
	valid bool
	req   map[Type]AttrMask
	opt   map[Type]AttrMask
}

// qpStateTable is IBA 11.2.4.2 / the kernel's qp_state_table
// (drivers/infiniband/core/verbs.c) restricted to RC, UC, UD and GSI.
var qpStateTable = func() (t [Err + 1][Err + 1]transition) {
	ok := transition{valid: true}
	for _, from := range []State{Reset, Init, RTR, RTS, SQD, SQE, Err} {
		t[from][Reset] = ok // any -> RESET
		t[from][Err] = ok   // any -> ERR
	}
	t[Reset][Init] = transition{valid: true,
		req: map[Type]AttrMask{
			UD:  AttrPKeyIndex | AttrPort | AttrQKey,
			UC:  AttrPKeyIndex | AttrPort | AttrAccessFlags,
			RC:  AttrPKeyIndex | AttrPort | AttrAccessFlags,
			GSI: AttrPKeyIndex | AttrQKey,
		}}
	t[Init][Init] = transition{valid: true,
		opt: map[Type]AttrMask{
			UD:  AttrPKeyIndex | AttrPort | AttrQKey,
			UC:  AttrPKeyIndex | AttrPort | AttrAccessFlags,
			RC:  AttrPKeyIndex | AttrPort | AttrAccessFlags,
			GSI: AttrPKeyIndex | AttrQKey,
		}}
	t[Init][RTR] = transition{valid: true,
		req: map[Type]AttrMask{
			UC: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN,
			RC: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
		},
		opt: map[Type]AttrMask{
			UD:  AttrPKeyIndex | AttrQKey,
			UC:  AttrAltPath | AttrAccessFlags | AttrPKeyIndex,
			RC:  AttrAltPath | AttrAccessFlags | AttrPKeyIndex,
			GSI: AttrPKeyIndex | AttrQKey,
		}}
	t[RTR][RTS] = transition{valid: true,
		req: map[Type]AttrMask{
			UD:  AttrSQPSN,
			UC:  AttrSQPSN,
			RC:  AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrSQPSN | AttrMaxQPRdAtomic,
			GSI: AttrSQPSN,
		},
		opt: map[Type]AttrMask{
			UD:  AttrCurState | AttrQKey,
			UC:  AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState,
			RC:  AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState,
			GSI: AttrCurState | AttrQKey,
		}}
	t[RTS][RTS] = transition{valid: true,
		opt: map[Type]AttrMask{
			UD:  AttrCurState | AttrQKey,
			UC:  AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState,
			RC:  AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState | AttrMinRNRTimer,
			GSI: AttrCurState | AttrQKey,
		}}
	t[RTS][SQD] = transition{valid: true,
		opt: map[Type]AttrMask{
			UD:  AttrEnSQDAsyncNotify,
			UC:  AttrEnSQDAsyncNotify,
			RC:  AttrEnSQDAsyncNotify,
			GSI: AttrEnSQDAsyncNotify,
		}}
	t[SQD][RTS] = transition{valid: true,
		opt: map[Type]AttrMask{
			UD:  AttrCurState | AttrQKey,
			UC:  AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState,
			RC:  AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState,
			GSI: AttrCurState | AttrQKey,
		}}
	t[SQD][SQD] = transition{valid: true,
		opt: map[Type]AttrMask{
			UD: AttrPKeyIndex | AttrQKey,
			UC: AttrAV | AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrPathMigState,
			RC: AttrPort | AttrAV | AttrTimeout | AttrRetryCnt | AttrRNRRetry |
				AttrMaxQPRdAtomic | AttrMaxDestRdAtomic | AttrAltPath | AttrAccessFlags |
				AttrPKeyIndex | AttrMinRNRTimer | AttrPathMigState,
			GSI: AttrPKeyIndex | AttrQKey,
		}}
	// RC has no SQE state: a send queue error takes an RC QP to ERR. The
	// kernel table still marks SQE->RTS valid for every type; RC simply can
	// never be in SQE, so the empty masks do no harm.
	t[SQE][RTS] = transition{valid: true,
		opt: map[Type]AttrMask{
			UD:  AttrCurState | AttrQKey,
			UC:  AttrCurState | AttrAccessFlags,
			GSI: AttrCurState | AttrQKey,
		}}
	return t
}()

// TransitionAttrs returns the attributes a QP of type t must (req) and may
// (opt, besides IBV_QP_STATE) supply to go from one state to another, and
// whether that transition exists at all.
func TransitionAttrs(t Type, from, to State) (req, opt AttrMask, ok bool) {
	if !t.Valid() || !from.Valid() || !to.Valid() {
		return 0, 0, false
	}
	tr := qpStateTable[from][to]
	return tr.req[t], tr.opt[t], tr.valid
}

// NextState is the state a modify with mask leads to from cur: a.State if
// mask has IBV_QP_STATE, else cur.
func NextState(cur State, a *Attr, mask AttrMask) State {
	if mask&AttrState != 0 && a != nil {
		return a.State
	}
	return cur
}

// Limits are the device limits attribute values are checked against.
type Limits struct {
	MaxQPWR         uint32 // max_qp_wr: send and receive queue depth
	MaxSendSGE      uint32 // max_send_sge
	MaxRecvSGE      uint32 // max_recv_sge
	MaxInlineData   uint32 // largest inline payload
	MaxQPRdAtom     uint32 // max_qp_rd_atom: reads/atomics a QP accepts (max_dest_rd_atomic)
	MaxQPInitRdAtom uint32 // max_qp_init_rd_atom: reads/atomics a QP initiates (max_rd_atomic)
	MaxMTU          MTU    // port active MTU ceiling
	NumPorts        uint8  // ports are numbered 1..NumPorts
	PKeyTableLen    uint16 // valid P_Key indexes are below this
	GIDTableLen     int    // valid source GID indexes are below this
}

// DefaultLimits are rdma_rxe's (rxe_param.h).
var DefaultLimits = Limits{
	MaxQPWR:         0x4000,
	MaxSendSGE:      32,
	MaxRecvSGE:      32,
	MaxInlineData:   400,
	MaxQPRdAtom:     128,
	MaxQPInitRdAtom: 128,
	MaxMTU:          MTU4096,
	NumPorts:        1,
	PKeyTableLen:    1,
	GIDTableLen:     1024,
}

// CheckModify reports whether a QP of type t in state cur may be modified
// with the attributes a selected by mask, following the IBA transition
// rules (the kernel's ib_modify_qp_is_ok) and rxe's value checks
// (rxe_qp_chk_attr) with DefaultLimits. It changes nothing. A rejection is
// a *ModifyError naming the offending attribute.
//
// QP.Modify adds what only the QP knows: like rxe it refuses to leave
// SQD for anything but ERR while the send queue is still draining
// (ErrSQDraining).
func CheckModify(t Type, cur State, a *Attr, mask AttrMask) error {
	return DefaultLimits.CheckModify(t, cur, a, mask)
}

// CheckModify is the package-level CheckModify with limits l.
func (l *Limits) CheckModify(t Type, cur State, a *Attr, mask AttrMask) error {
	if !t.Valid() {
		return &ModifyError{Type: t, From: cur, To: cur, Kind: ErrBadQPType}
	}
	// nil attributes read as zero values, and an empty mask is still the
	// move from cur to cur: the kernel's ib_modify_qp_is_ok takes the next
	// state as the current one without IB_QP_STATE and looks that up, and
	// its table has no RTR->RTR nor SQE->SQE (EINVAL on rxe).
	if a == nil {
		a = &Attr{}
	}
	to := NextState(cur, a, mask)
	// Errors are built only on failure so a successful check does not
	// allocate.
	fail := func(kind error, bit AttrMask, detail string, args ...any) error {
		return &ModifyError{Type: t, From: cur, To: to, Kind: kind, Attr: bit, Detail: fmt.Sprintf(detail, args...)}
	}
	if !cur.Valid() {
		return fail(ErrAttrValue, AttrCurState, "current state %v is not a QP state", cur)
	}
	if mask&AttrState != 0 && !a.State.Valid() {
		to = cur
		return fail(ErrAttrValue, AttrState, "%d is not a QP state", int(a.State))
	}
	if unknown := mask &^ AttrAll; unknown != 0 {
		return fail(ErrAttrNotAllowed, lowestBit(unknown), "")
	}
	if mask&AttrCurState != 0 {
		if !a.CurState.Valid() {
			return fail(ErrAttrValue, AttrCurState, "%d is not a QP state", int(a.CurState))
		}
		if a.CurState != cur {
			return fail(ErrCurStateMismatch, AttrCurState, "is %v but the QP is %v", a.CurState, cur)
		}
	}
	tr := qpStateTable[cur][to]
	if !tr.valid {
		return fail(ErrInvalidTransition, AttrState, "")
	}
	req, opt := tr.req[t], tr.opt[t]
	if missing := req &^ mask; missing != 0 {
		return fail(ErrMissingAttr, lowestBit(missing), "")
	}
	if extra := mask &^ (req | opt | AttrState); extra != 0 {
		return fail(ErrAttrNotAllowed, lowestBit(extra), "")
	}
	if bit, detail := l.checkValues(a, mask); bit != 0 {
		return fail(ErrAttrValue, bit, "%s", detail)
	}
	return nil
}

func lowestBit(m AttrMask) AttrMask {
	return AttrMask(1) << bits.TrailingZeros32(uint32(m))
}

// qpAccessSupported are the access bits a QP's AccessFlags may hold.
const qpAccessSupported = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead |
	AccessRemoteAtomic | AccessFlushGlobal | AccessFlushPersistent

// checkValues range-checks every selected attribute, in mask bit order,
// and returns the first bad one with an explanation.
func (l *Limits) checkValues(a *Attr, mask AttrMask) (AttrMask, string) {
	if mask&AttrAccessFlags != 0 && a.AccessFlags&^qpAccessSupported != 0 {
		return AttrAccessFlags, fmt.Sprintf("has unsupported bits %#x", a.AccessFlags&^qpAccessSupported)
	}
	if mask&AttrPKeyIndex != 0 && a.PKeyIndex >= l.PKeyTableLen {
		return AttrPKeyIndex, fmt.Sprintf("%d out of range (P_Key table has %d entries)", a.PKeyIndex, l.PKeyTableLen)
	}
	if mask&AttrPort != 0 && (a.PortNum == 0 || a.PortNum > l.NumPorts) {
		return AttrPort, fmt.Sprintf("%d out of range (ports 1..%d)", a.PortNum, l.NumPorts)
	}
	if mask&AttrAV != 0 {
		if d := l.checkAV(&a.AV); d != "" {
			return AttrAV, d
		}
	}
	if mask&AttrPathMTU != 0 {
		if !a.PathMTU.Valid() {
			return AttrPathMTU, fmt.Sprintf("%d is not an MTU enum (1=256 .. 5=4096)", int(a.PathMTU))
		}
		if a.PathMTU > l.MaxMTU {
			return AttrPathMTU, fmt.Sprintf("%v exceeds the port MTU %v", a.PathMTU, l.MaxMTU)
		}
	}
	if mask&AttrTimeout != 0 && a.Timeout > 31 {
		return AttrTimeout, fmt.Sprintf("%d out of range (max 31)", a.Timeout)
	}
	if mask&AttrRetryCnt != 0 && a.RetryCnt > 7 {
		return AttrRetryCnt, fmt.Sprintf("%d out of range (max 7)", a.RetryCnt)
	}
	if mask&AttrRNRRetry != 0 && a.RNRRetry > 7 {
		return AttrRNRRetry, fmt.Sprintf("%d out of range (max 7)", a.RNRRetry)
	}
	// rq_psn and sq_psn are not checked: like rxe_qp_from_attr, Modify
	// keeps their low 24 bits (a C program's sq_psn = lrand48() works).
	if mask&AttrMaxQPRdAtomic != 0 && uint32(a.MaxRdAtomic) > l.MaxQPInitRdAtom {
		return AttrMaxQPRdAtomic, fmt.Sprintf("%d out of range (max %d)", a.MaxRdAtomic, l.MaxQPInitRdAtom)
	}
	if mask&AttrAltPath != 0 {
		if d := l.checkAV(&a.AltAV); d != "" {
			return AttrAltPath, "alternate " + d
		}
		if a.AltPortNum == 0 || a.AltPortNum > l.NumPorts {
			return AttrAltPath, fmt.Sprintf("alt_port_num %d out of range (ports 1..%d)", a.AltPortNum, l.NumPorts)
		}
		if a.AltTimeout > 31 {
			return AttrAltPath, fmt.Sprintf("alt_timeout %d out of range (max 31)", a.AltTimeout)
		}
		if a.AltPKeyIndex >= l.PKeyTableLen {
			return AttrAltPath, fmt.Sprintf("alt_pkey_index %d out of range (P_Key table has %d entries)", a.AltPKeyIndex, l.PKeyTableLen)
		}
	}
	if mask&AttrMinRNRTimer != 0 && a.MinRNRTimer > 31 {
		return AttrMinRNRTimer, fmt.Sprintf("%d out of range (max 31)", a.MinRNRTimer)
	}
	if mask&AttrMaxDestRdAtomic != 0 && uint32(a.MaxDestRdAtomic) > l.MaxQPRdAtom {
		return AttrMaxDestRdAtomic, fmt.Sprintf("%d out of range (max %d)", a.MaxDestRdAtomic, l.MaxQPRdAtom)
	}
	if mask&AttrPathMigState != 0 && (a.PathMigState < Migrated || a.PathMigState > Armed) {
		return AttrPathMigState, fmt.Sprintf("%d is not a migration state", int(a.PathMigState))
	}
	if mask&AttrDestQPN != 0 && a.DestQPN > PSNMask {
		return AttrDestQPN, fmt.Sprintf("%#x does not fit 24 bits", a.DestQPN)
	}
	return 0, ""
}

// checkAV validates an address vector, returning "" if it is usable.
func (l *Limits) checkAV(av *AddrVector) string {
	switch {
	case !av.DGID.IsValid():
		return "destination GID not set"
	case av.DGID.IsUnspecified():
		return fmt.Sprintf("destination GID %v is unspecified", av.DGID)
	case int(av.SGIDIndex) >= l.GIDTableLen:
		return fmt.Sprintf("sgid_index %d out of range (GID table has %d entries)", av.SGIDIndex, l.GIDTableLen)
	case av.FlowLabel > wire.FlowLabelMask:
		return fmt.Sprintf("flow_label %#x does not fit 20 bits", av.FlowLabel)
	case av.SL > 15:
		return fmt.Sprintf("sl %d out of range (max 15)", av.SL)
	case av.PortNum > l.NumPorts:
		return fmt.Sprintf("port_num %d out of range (ports 1..%d)", av.PortNum, l.NumPorts)
	}
	return ""
}

// Errors from CheckCap.
var ErrCapRange = errors.New("qp: capability out of range")

// CheckCap validates the queue sizes requested at QP creation, like rxe's
// rxe_qp_chk_cap. With an SRQ the receive sizes are ignored.
func (l *Limits) CheckCap(c Cap, hasSRQ bool) error {
	chk := func(name string, v, max uint32) error {
		if v > max {
			return fmt.Errorf("%w: %s %d > %d", ErrCapRange, name, v, max)
		}
		return nil
	}
	if err := chk("max_send_wr", c.MaxSendWR, l.MaxQPWR); err != nil {
		return err
	}
	if err := chk("max_send_sge", c.MaxSendSGE, l.MaxSendSGE); err != nil {
		return err
	}
	if err := chk("max_inline_data", c.MaxInlineData, l.MaxInlineData); err != nil {
		return err
	}
	if !hasSRQ {
		if err := chk("max_recv_wr", c.MaxRecvWR, l.MaxQPWR); err != nil {
			return err
		}
		if err := chk("max_recv_sge", c.MaxRecvSGE, l.MaxRecvSGE); err != nil {
			return err
		}
	}
	return nil
}
