package ib

import "github.com/rxed/rxed/pkg/mr"

// MWBind is struct ibv_mw_bind: what BindMW binds a type 1 window to.
type MWBind struct {
	ID     uint64    // wr_id of the BIND_MW completion
	Flags  SendFlags // SendSignaled for a completion on success; SendFence
	MR     *MR       // region the window lies in (registered with AccessMWBind); nil unbinds
	Addr   uint64    // start of the window, an address of MR
	Length uint64    // window length; 0 unbinds
	Access Access    // remote rights the window grants (AccessRemote*, AccessZeroBased)
}

// BindMW binds a type 1 memory window through the QP's send queue, like
// ibv_bind_mw: it posts a BIND_MW work request and returns the rkey the
// window will have once that request executes (the old one with its key
// part incremented). The peer may use the new rkey after the bind's
// completion, or after any later completion on this QP. A failed bind
// completes with MW_BIND_ERR and moves the QP to ERR. The window's rkey
// changes when the bind executes (libibverbs changes it at post time), so
// bind a window again only after its previous bind has executed. Type 2
// windows are bound by posting a BIND_MW work request directly
// (SendWR.Bind).
//
// What ibv_bind_mw and rxe's provider refuse before posting anything
// (verbs.h: a window of another type than 1; rxe_bind_mw: an address or
// length without a region, a zero-based window, a region of another PD
// than the window's) BindMW refuses too, changing nothing, with
// ErrInvalidArgument or ErrPDMismatch.
func (q *QP) BindMW(mw *MW, b MWBind) (uint32, error) {
	if err := checkBind(mw, &b); err != nil {
		return 0, err
	}
	cur := mw.RKey()
	next := IncRKey(cur)
	info := MWBindInfo{MWRKey: cur, NewRKey: next, Addr: b.Addr, Length: b.Length, Access: b.Access}
	if b.MR != nil {
		info.MRLKey = b.MR.LKey()
	}
	if err := q.PostSend(SendWR{ID: b.ID, Opcode: WRBindMW, Flags: b.Flags, Bind: info}); err != nil {
		return 0, err
	}
	return next, nil
}

// ErrPDMismatch: objects of different protection domains were combined
// (a window bound over a region of another PD).
var ErrPDMismatch = mr.ErrPDMismatch

// checkBind is ibv_bind_mw's check of the window type and rdma-core's
// rxe_bind_mw checks, in their order: they fail the call (EINVAL, EPERM)
// where the same bind posted would fail only at execution, with
// MW_BIND_ERR and the QP in ERR.
func checkBind(mw *MW, b *MWBind) error {
	switch {
	case mw == nil:
		return errorf(ErrInvalidArgument, "ib: BindMW: nil window")
	case mw.Type() != MWType1:
		return errorf(ErrInvalidArgument, "ib: BindMW: type %v window; post a BIND_MW work request", mw.Type())
	case b.MR == nil && (b.Addr != 0 || b.Length != 0):
		return errorf(ErrInvalidArgument, "ib: BindMW: address %#x length %d without a region", b.Addr, b.Length)
	case b.Access&AccessZeroBased != 0:
		return errorf(ErrInvalidArgument, "ib: BindMW: a type 1 window cannot be zero based")
	case b.MR != nil && b.MR.mr().PD() != nil && b.MR.mr().PD() != mw.mw().PD():
		return errorf(ErrPDMismatch, "ib: BindMW: region %#x is in another PD than the window", b.MR.LKey())
	}
	return nil
}
