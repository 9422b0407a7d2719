package ib

import (
	"errors"
	"fmt"
)

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
// windows are
// bound by posting a BIND_MW work request directly (SendWR.Bind).
func (q *QP) BindMW(mw *MW, b MWBind) (uint32, error) {
	if mw == nil {
		return 0, errors.New("ib: BindMW: nil window")
	}
	if mw.Type() != MWType1 {
		return 0, fmt.Errorf("ib: BindMW: type %v window; post a BIND_MW work request", mw.Type())
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
