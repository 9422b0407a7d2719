package qp

import (
	"fmt"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/stretchr/testify/require"
)

// A modify without IBV_QP_STATE is the move from the QP's state to the
// same state, which the kernel's ib_modify_qp_is_ok (called by
// rxe_qp_chk_attr) looks up in qp_state_table like any other: RESET,
// INIT, RTS, SQD and ERR have an entry for it, RTR and SQE have none, so
// there it is EINVAL whatever the mask. rxed let an empty mask with nil
// attributes through in every state (CheckModify returned at once), so
// QP.Modify(nil, 0) on an RTR QP succeeded. Each row is one same-state
// pair, with the attributes the kernel table lets it change.
func TestSameStateModifyFollowsTheKernelTable(t *testing.T) {
	rows := []struct {
		state State
		valid bool
		opt   map[Type]AttrMask // verbs.c qp_state_table[state][state].opt_param
	}{
		{Reset, true, nil},
		{Init, true, map[Type]AttrMask{
			RC: AttrPKeyIndex | AttrPort | AttrAccessFlags, UC: AttrPKeyIndex | AttrPort | AttrAccessFlags,
			UD: AttrPKeyIndex | AttrPort | AttrQKey, GSI: AttrPKeyIndex | AttrQKey}},
		{RTR, false, nil},
		{RTS, true, map[Type]AttrMask{
			RC: AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState | AttrMinRNRTimer,
			UC: AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState,
			UD: AttrCurState | AttrQKey, GSI: AttrCurState | AttrQKey}},
		{SQD, true, map[Type]AttrMask{
			RC: AttrPort | AttrAV | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic |
				AttrMaxDestRdAtomic | AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrMinRNRTimer | AttrPathMigState,
			UC: AttrAV | AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrPathMigState,
			UD: AttrPKeyIndex | AttrQKey, GSI: AttrPKeyIndex | AttrQKey}},
		{SQE, false, nil},
		{Err, true, nil},
	}
	require.Len(t, rows, len(allStates))
	for _, r := range rows {
		for _, typ := range allTypes {
			name := fmt.Sprintf("%v %v->%v", typ, r.state, r.state)
			a := goodAttr(r.state, r.state)
			_, opt, ok := TransitionAttrs(typ, r.state, r.state)
			require.Equal(t, r.valid, ok, name)
			require.Equal(t, r.opt[typ], opt, name)
			// Without IBV_QP_STATE (nil or zero attributes, empty mask) and
			// with it naming the same state: one verdict.
			for _, c := range []struct {
				what string
				a    *Attr
				mask AttrMask
			}{
				{"nil, no mask", nil, 0},
				{"zero attributes, no mask", &Attr{}, 0},
				{"IBV_QP_STATE", a, AttrState},
			} {
				err := CheckModify(typ, r.state, c.a, c.mask)
				if r.valid {
					require.NoError(t, err, "%s: %s", name, c.what)
					continue
				}
				require.ErrorIs(t, err, ErrInvalidTransition, "%s: %s", name, c.what)
				var me *ModifyError
				require.ErrorAs(t, err, &me)
				require.Equal(t, r.state, me.From, name)
				require.Equal(t, r.state, me.To, name)
			}
			// Each attribute alone, without IBV_QP_STATE: allowed exactly
			// when the table's entry lists it.
			for b := AttrMask(1); b != 0 && b <= AttrRateLimit; b <<= 1 {
				if b&AttrAll == 0 || b == AttrState {
					continue
				}
				err := CheckModify(typ, r.state, a, b)
				switch {
				case !r.valid:
					require.ErrorIs(t, err, ErrInvalidTransition, "%s %v", name, b)
				case opt&b != 0:
					require.NoError(t, err, "%s %v", name, b)
				default:
					require.ErrorIs(t, err, ErrAttrNotAllowed, "%s %v", name, b)
				}
			}
		}
	}
}

// QP.Modify on an RTR QP with nothing to change fails as CheckModify
// does and leaves the QP in RTR; with nil attributes and a mask it reads
// zero values instead of dereferencing nil on the engine's worker.
func TestQPModifyWithoutStateOnRTR(t *testing.T) {
	mem := mr.NewTable(nil)
	pd, err := mem.AllocPD()
	require.NoError(t, err)
	scq, err := NewCQ(8)
	require.NoError(t, err)
	q, err := New(Config{Type: RC, Num: 0x11, PD: pd, Mem: mem, SendCQ: scq, RecvCQ: scq,
		Cap: Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	now := time.Unix(0, 0)
	init := goodAttr(Reset, Init)
	require.NoError(t, q.Modify(init, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags, now))
	rtr := goodAttr(Init, RTR)
	require.NoError(t, q.Modify(rtr, AttrState|AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRdAtomic|AttrMinRNRTimer, now))
	for _, c := range []struct {
		a    *Attr
		mask AttrMask
	}{{nil, 0}, {&Attr{}, 0}, {nil, AttrMinRNRTimer}, {rtr, AttrState}} {
		err := q.Modify(c.a, c.mask, now)
		require.ErrorIs(t, err, ErrInvalidTransition, "%+v", c)
		require.Equal(t, RTR, q.State())
	}
	rts := goodAttr(RTR, RTS)
	require.NoError(t, q.Modify(rts, AttrState|AttrTimeout|AttrRetryCnt|AttrRNRRetry|AttrSQPSN|AttrMaxQPRdAtomic, now))
	require.NoError(t, q.Modify(nil, 0, now))
	require.NoError(t, q.Modify(nil, AttrMinRNRTimer, now), "nil attributes read as zero")
	require.Equal(t, uint8(0), q.Attr().MinRNRTimer)
	require.Equal(t, RTS, q.State())
}
