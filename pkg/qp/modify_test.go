package qp

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var allTypes = []Type{RC, UC, UD, GSI}
var allStates = []State{Reset, Init, RTR, RTS, SQD, SQE, Err}

// goodAttr returns attributes whose every value is acceptable, for the
// move to state to from cur.
func goodAttr(cur, to State) *Attr {
	av := AddrVector{DGID: netip.MustParseAddr("127.0.0.2"), HopLimit: 64, PortNum: 1}
	return &Attr{
		State: to, CurState: cur,
		PathMTU: MTU1024, PathMigState: Migrated, QKey: 0x11111111,
		RQPSN: 0xABCDEF, SQPSN: 0x123456, DestQPN: 0x11,
		AccessFlags: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic,
		AV:          av, AltAV: av, PortNum: 1, AltPortNum: 1,
		Timeout: 14, AltTimeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12,
		MaxRdAtomic: 16, MaxDestRdAtomic: 16,
	}
}

// spec is the IBA 11.2.4.2 table (as in the kernel's qp_state_table)
// written out independently of modify.go: "TYPE FROM->TO: req | opt".
var spec = `
RC  RESET->INIT: PKEY_INDEX PORT ACCESS_FLAGS |
UC  RESET->INIT: PKEY_INDEX PORT ACCESS_FLAGS |
UD  RESET->INIT: PKEY_INDEX PORT QKEY |
GSI RESET->INIT: PKEY_INDEX QKEY |
RC  INIT->INIT: | PKEY_INDEX PORT ACCESS_FLAGS
UC  INIT->INIT: | PKEY_INDEX PORT ACCESS_FLAGS
UD  INIT->INIT: | PKEY_INDEX PORT QKEY
GSI INIT->INIT: | PKEY_INDEX QKEY
RC  INIT->RTR: AV PATH_MTU DEST_QPN RQ_PSN MAX_DEST_RD_ATOMIC MIN_RNR_TIMER | ALT_PATH ACCESS_FLAGS PKEY_INDEX
UC  INIT->RTR: AV PATH_MTU DEST_QPN RQ_PSN | ALT_PATH ACCESS_FLAGS PKEY_INDEX
UD  INIT->RTR: | PKEY_INDEX QKEY
GSI INIT->RTR: | PKEY_INDEX QKEY
RC  RTR->RTS: SQ_PSN TIMEOUT RETRY_CNT RNR_RETRY MAX_QP_RD_ATOMIC | CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE
UC  RTR->RTS: SQ_PSN | CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE
UD  RTR->RTS: SQ_PSN | CUR_STATE QKEY
GSI RTR->RTS: SQ_PSN | CUR_STATE QKEY
RC  RTS->RTS: | CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE MIN_RNR_TIMER
UC  RTS->RTS: | CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE
UD  RTS->RTS: | CUR_STATE QKEY
GSI RTS->RTS: | CUR_STATE QKEY
RC  RTS->SQD: | EN_SQD_ASYNC_NOTIFY
UC  RTS->SQD: | EN_SQD_ASYNC_NOTIFY
UD  RTS->SQD: | EN_SQD_ASYNC_NOTIFY
GSI RTS->SQD: | EN_SQD_ASYNC_NOTIFY
RC  SQD->RTS: | CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE
UC  SQD->RTS: | CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE
UD  SQD->RTS: | CUR_STATE QKEY
GSI SQD->RTS: | CUR_STATE QKEY
RC  SQD->SQD: | PORT AV TIMEOUT RETRY_CNT RNR_RETRY MAX_QP_RD_ATOMIC MAX_DEST_RD_ATOMIC ALT_PATH ACCESS_FLAGS PKEY_INDEX MIN_RNR_TIMER PATH_MIG_STATE
UC  SQD->SQD: | AV ALT_PATH ACCESS_FLAGS PKEY_INDEX PATH_MIG_STATE
UD  SQD->SQD: | PKEY_INDEX QKEY
GSI SQD->SQD: | PKEY_INDEX QKEY
RC  SQE->RTS: |
UC  SQE->RTS: | CUR_STATE ACCESS_FLAGS
UD  SQE->RTS: | CUR_STATE QKEY
GSI SQE->RTS: | CUR_STATE QKEY
`

func parseMask(t *testing.T, words string) AttrMask {
	var m AttrMask
	for _, w := range strings.Fields(words) {
		found := false
		for bit, name := range attrNames {
			if name == "IBV_QP_"+w {
				m |= bit
				found = true
			}
		}
		require.True(t, found, "unknown attribute %q", w)
	}
	return m
}

type specEntry struct{ req, opt AttrMask }

func parseSpec(t *testing.T) map[string]specEntry {
	out := map[string]specEntry{}
	for _, line := range strings.Split(strings.TrimSpace(spec), "\n") {
		head, masks, ok := strings.Cut(line, ":")
		require.True(t, ok, line)
		req, opt, ok := strings.Cut(masks, "|")
		require.True(t, ok, line)
		f := strings.Fields(head)
		out[f[0]+" "+f[1]] = specEntry{parseMask(t, req), parseMask(t, opt)}
	}
	return out
}

func TestTransitionTableMatchesSpec(t *testing.T) {
	want := parseSpec(t)
	for _, typ := range allTypes {
		for _, from := range allStates {
			for _, to := range allStates {
				req, opt, ok := TransitionAttrs(typ, from, to)
				key := fmt.Sprintf("%v %v->%v", typ, from, to)
				e, inSpec := want[key]
				anyToResetOrErr := to == Reset || to == Err
				switch {
				case inSpec:
					require.True(t, ok, key)
					require.Equal(t, e.req, req, "%s req: got %v want %v", key, req, e.req)
					require.Equal(t, e.opt, opt, "%s opt: got %v want %v", key, opt, e.opt)
				case anyToResetOrErr:
					require.True(t, ok, key)
					require.Zero(t, req, key)
					require.Zero(t, opt, key)
				default:
					require.False(t, ok, key)
				}
			}
		}
	}
	_, _, ok := TransitionAttrs(Type(9), Reset, Init)
	require.False(t, ok)
	_, _, ok = TransitionAttrs(RC, State(9), Init)
	require.False(t, ok)
}

// TestCheckModifyEveryTransitionAndMask generates, for every QP type and
// every pair of states, the valid minimal and maximal masks, every mask
// with one required attribute left out and every mask with one
// attribute that does not belong, and checks the verdict and the
// attribute the error names.
func TestCheckModifyEveryTransitionAndMask(t *testing.T) {
	cases := 0
	for _, typ := range allTypes {
		for _, from := range allStates {
			for _, to := range allStates {
				req, opt, ok := TransitionAttrs(typ, from, to)
				a := goodAttr(from, to)
				name := fmt.Sprintf("%v %v->%v", typ, from, to)
				if !ok {
					err := CheckModify(typ, from, a, AttrState|req)
					var me *ModifyError
					require.ErrorAs(t, err, &me, name)
					require.ErrorIs(t, err, ErrInvalidTransition, name)
					require.Equal(t, AttrState, me.Attr)
					require.Equal(t, from, me.From)
					require.Equal(t, to, me.To)
					require.Contains(t, err.Error(), fmt.Sprintf("%v->%v", from, to))
					cases++
					continue
				}
				require.NoError(t, CheckModify(typ, from, a, AttrState|req), "%s minimal", name)
				require.NoError(t, CheckModify(typ, from, a, AttrState|req|opt), "%s maximal", name)
				// Each optional attribute alone is fine too.
				for b := AttrMask(1); b != 0 && b <= AttrRateLimit; b <<= 1 {
					if opt&b != 0 {
						require.NoError(t, CheckModify(typ, from, a, AttrState|req|b), "%s +%v", name, b)
						cases++
					}
				}
				cases += 2
				for b := AttrMask(1); b != 0 && b <= AttrRateLimit; b <<= 1 {
					if b&AttrAll == 0 || b == AttrState {
						continue
					}
					mask := AttrState | req | opt
					switch {
					case req&b != 0:
						err := CheckModify(typ, from, a, mask&^b)
						require.ErrorIs(t, err, ErrMissingAttr, "%s without %v", name, b)
						var me *ModifyError
						require.ErrorAs(t, err, &me)
						require.Equal(t, b, me.Attr, "%s without %v: %v", name, b, err)
						require.Equal(t, fmt.Sprintf("qp: %v->%v on %v requires %v", from, to, typ, b), err.Error())
					case opt&b == 0:
						err := CheckModify(typ, from, a, mask|b)
						require.ErrorIs(t, err, ErrAttrNotAllowed, "%s with %v", name, b)
						var me *ModifyError
						require.ErrorAs(t, err, &me)
						require.Equal(t, b, me.Attr, "%s with %v: %v", name, b, err)
						require.Equal(t, fmt.Sprintf("qp: %v->%v on %v does not allow %v", from, to, typ, b), err.Error())
					default:
						continue
					}
					cases++
				}
			}
		}
	}
	require.Greater(t, cases, 500)
}

// Random masks, seeded: the verdict must match the spec table above,
// reading a mask as valid exactly when it holds every required and only
// required, optional or STATE bits.
func TestCheckModifyRandomMasks(t *testing.T) {
	want := parseSpec(t)
	rng := rand.New(rand.NewPCG(1, 2))
	accepted := 0
	for i := 0; i < 20000; i++ {
		typ := allTypes[rng.IntN(len(allTypes))]
		from := allStates[rng.IntN(len(allStates))]
		to := allStates[rng.IntN(len(allStates))]
		e, inSpec := want[fmt.Sprintf("%v %v->%v", typ, from, to)]
		mask := AttrState | AttrMask(rng.Uint32())&AttrAll
		switch rng.IntN(3) {
		case 0: // a plausible mask: required plus some optional
			mask = AttrState | e.req | AttrMask(rng.Uint32())&e.opt
		case 1: // the same with one bit flipped
			mask = AttrState | e.req | AttrMask(rng.Uint32())&e.opt
			mask ^= AttrMask(1) << rng.IntN(26) & AttrAll &^ AttrState
		}
		valid := inSpec || to == Reset || to == Err
		ok := valid && mask&e.req == e.req && mask&^(e.req|e.opt|AttrState) == 0
		err := CheckModify(typ, from, goodAttr(from, to), mask)
		require.Equal(t, ok, err == nil, "%v %v->%v mask %v: %v", typ, from, to, mask, err)
		if ok {
			accepted++
		}
	}
	require.Greater(t, accepted, 500, "the sample must exercise both verdicts")
}

// Key cases written from the IBA spec by hand.
func TestCheckModifyKeyCases(t *testing.T) {
	rcInitToRTR := AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer
	rcRTRToRTS := AttrState | AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic
	cases := []struct {
		name     string
		typ      Type
		cur, to  State
		mask     AttrMask
		wantKind error
		wantAttr AttrMask
		wantMsg  string
	}{
		{"RC RESET->INIT", RC, Reset, Init, AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags, nil, 0, ""},
		{"RC RESET->INIT without access flags", RC, Reset, Init, AttrState | AttrPKeyIndex | AttrPort, ErrMissingAttr, AttrAccessFlags,
			"qp: RESET->INIT on RC requires IBV_QP_ACCESS_FLAGS"},
		{"RC RESET->INIT with QKEY", RC, Reset, Init, AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags | AttrQKey, ErrAttrNotAllowed, AttrQKey,
			"qp: RESET->INIT on RC does not allow IBV_QP_QKEY"},
		{"UD RESET->INIT", UD, Reset, Init, AttrState | AttrPKeyIndex | AttrPort | AttrQKey, nil, 0, ""},
		{"UD RESET->INIT with access flags", UD, Reset, Init, AttrState | AttrPKeyIndex | AttrPort | AttrQKey | AttrAccessFlags, ErrAttrNotAllowed, AttrAccessFlags, ""},
		{"GSI RESET->INIT needs no port", GSI, Reset, Init, AttrState | AttrPKeyIndex | AttrQKey, nil, 0, ""},
		{"RC INIT->RTR", RC, Init, RTR, rcInitToRTR, nil, 0, ""},
		{"RC INIT->RTR without DEST_QPN", RC, Init, RTR, rcInitToRTR &^ AttrDestQPN, ErrMissingAttr, AttrDestQPN,
			"qp: INIT->RTR on RC requires IBV_QP_DEST_QPN"},
		{"RC INIT->RTR without AV", RC, Init, RTR, rcInitToRTR &^ AttrAV, ErrMissingAttr, AttrAV, ""},
		{"RC INIT->RTR without MIN_RNR_TIMER", RC, Init, RTR, rcInitToRTR &^ AttrMinRNRTimer, ErrMissingAttr, AttrMinRNRTimer, ""},
		{"UC INIT->RTR needs no rd atomic", UC, Init, RTR, AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN, nil, 0, ""},
		{"UC INIT->RTR rejects MAX_DEST_RD_ATOMIC", UC, Init, RTR, AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic,
			ErrAttrNotAllowed, AttrMaxDestRdAtomic, ""},
		{"UD INIT->RTR needs only STATE", UD, Init, RTR, AttrState, nil, 0, ""},
		{"UD INIT->RTR rejects DEST_QPN", UD, Init, RTR, AttrState | AttrDestQPN, ErrAttrNotAllowed, AttrDestQPN,
			"qp: INIT->RTR on UD does not allow IBV_QP_DEST_QPN"},
		{"RC RTR->RTS", RC, RTR, RTS, rcRTRToRTS, nil, 0, ""},
		{"RC RTR->RTS without RETRY_CNT", RC, RTR, RTS, rcRTRToRTS &^ AttrRetryCnt, ErrMissingAttr, AttrRetryCnt,
			"qp: RTR->RTS on RC requires IBV_QP_RETRY_CNT"},
		{"RC RTR->RTS without SQ_PSN", RC, RTR, RTS, rcRTRToRTS &^ AttrSQPSN, ErrMissingAttr, AttrSQPSN, ""},
		{"UD RTR->RTS", UD, RTR, RTS, AttrState | AttrSQPSN, nil, 0, ""},
		{"UD RTR->RTS rejects TIMEOUT", UD, RTR, RTS, AttrState | AttrSQPSN | AttrTimeout, ErrAttrNotAllowed, AttrTimeout, ""},
		{"RC RTS->RTS change MIN_RNR_TIMER", RC, RTS, RTS, AttrState | AttrMinRNRTimer, nil, 0, ""},
		{"RC RTS modify without STATE", RC, RTS, RTS, AttrAccessFlags, nil, 0, ""},
		{"RC RTR modify without STATE", RC, RTR, RTR, AttrAccessFlags, ErrInvalidTransition, AttrState,
			"qp: RTR->RTR is not a valid transition for RC"},
		{"RC RTS->SQD", RC, RTS, SQD, AttrState | AttrEnSQDAsyncNotify, nil, 0, ""},
		{"RC SQD->RTS", RC, SQD, RTS, AttrState, nil, 0, ""},
		{"RC SQD->SQD change AV and timeout", RC, SQD, SQD, AttrState | AttrAV | AttrTimeout, nil, 0, ""},
		{"UC SQE->RTS", UC, SQE, RTS, AttrState | AttrCurState, nil, 0, ""},
		{"RC SQE->RTS allows nothing", RC, SQE, RTS, AttrState | AttrCurState, ErrAttrNotAllowed, AttrCurState, ""},
		{"RC RESET->RTR skips a state", RC, Reset, RTR, rcInitToRTR, ErrInvalidTransition, AttrState,
			"qp: RESET->RTR is not a valid transition for RC"},
		{"RC RTS->INIT goes backwards", RC, RTS, Init, AttrState, ErrInvalidTransition, AttrState, ""},
		{"RC ERR->RTS", RC, Err, RTS, AttrState, ErrInvalidTransition, AttrState, ""},
		{"RC RTS->SQE is not a verb transition", RC, RTS, SQE, AttrState, ErrInvalidTransition, AttrState, ""},
		{"any->ERR", RC, RTS, Err, AttrState, nil, 0, ""},
		{"any->ERR with attributes", RC, RTS, Err, AttrState | AttrQKey, ErrAttrNotAllowed, AttrQKey, ""},
		{"any->RESET", UD, SQE, Reset, AttrState, nil, 0, ""},
		{"RESET->RESET", UC, Reset, Reset, AttrState, nil, 0, ""},
		{"ERR->ERR", UC, Err, Err, AttrState, nil, 0, ""},
		{"RESET->ERR", RC, Reset, Err, AttrState, nil, 0, ""},
		{"CUR_STATE from INIT", RC, Init, Init, AttrState | AttrCurState, ErrAttrNotAllowed, AttrCurState, ""},
		{"RATE_LIMIT is raw-packet only", RC, RTS, RTS, AttrState | AttrRateLimit, ErrAttrNotAllowed, AttrRateLimit, ""},
		{"unknown mask bit", RC, RTS, RTS, AttrState | 1<<30, ErrAttrNotAllowed, 1 << 30, ""},
		{"CAP cannot be modified", RC, RTS, RTS, AttrState | AttrCap, ErrAttrNotAllowed, AttrCap, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := goodAttr(c.cur, c.to)
			err := CheckModify(c.typ, c.cur, a, c.mask)
			if c.wantKind == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, c.wantKind)
			var me *ModifyError
			require.ErrorAs(t, err, &me)
			require.Equal(t, c.wantAttr, me.Attr, "%v", err)
			if c.wantMsg != "" {
				require.Equal(t, c.wantMsg, err.Error())
			}
		})
	}
}

func TestCheckModifyValues(t *testing.T) {
	rcInitToRTR := AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer
	rcRTRToRTS := AttrState | AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic
	rcResetToInit := AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags
	cases := []struct {
		name    string
		cur, to State
		mask    AttrMask
		mutate  func(*Attr)
		bad     AttrMask // 0: accepted
	}{
		{"retry_cnt 7", RTR, RTS, rcRTRToRTS, func(a *Attr) { a.RetryCnt = 7 }, 0},
		{"retry_cnt 8", RTR, RTS, rcRTRToRTS, func(a *Attr) { a.RetryCnt = 8 }, AttrRetryCnt},
		{"rnr_retry 7 (infinite)", RTR, RTS, rcRTRToRTS, func(a *Attr) { a.RNRRetry = 7 }, 0},
		{"rnr_retry 8", RTR, RTS, rcRTRToRTS, func(a *Attr) { a.RNRRetry = 8 }, AttrRNRRetry},
		{"timeout 0 (infinite)", RTR, RTS, rcRTRToRTS, func(a *Attr) { a.Timeout = 0 }, 0},
		{"timeout 31", RTR, RTS, rcRTRToRTS, func(a *Attr) { a.Timeout = 31 }, 0},
		{"timeout 32", RTR, RTS, rcRTRToRTS, func(a *Attr) { a.Timeout = 32 }, AttrTimeout},
		{"max_rd_atomic 128", RTR, RTS, rcRTRToRTS, func(a *Attr) { a.MaxRdAtomic = 128 }, 0},
		{"max_rd_atomic 129", RTR, RTS, rcRTRToRTS, func(a *Attr) { a.MaxRdAtomic = 129 }, AttrMaxQPRdAtomic},
		{"sq_psn 25 bits (masked, rxe_qp_from_attr)", RTR, RTS, rcRTRToRTS, func(a *Attr) { a.SQPSN = 1 << 24 }, 0},
		{"path_mtu 0", Init, RTR, rcInitToRTR, func(a *Attr) { a.PathMTU = 0 }, AttrPathMTU},
		{"path_mtu 6", Init, RTR, rcInitToRTR, func(a *Attr) { a.PathMTU = 6 }, AttrPathMTU},
		{"path_mtu 4096", Init, RTR, rcInitToRTR, func(a *Attr) { a.PathMTU = MTU4096 }, 0},
		{"path_mtu 256", Init, RTR, rcInitToRTR, func(a *Attr) { a.PathMTU = MTU256 }, 0},
		{"max_dest_rd_atomic 200", Init, RTR, rcInitToRTR, func(a *Attr) { a.MaxDestRdAtomic = 200 }, AttrMaxDestRdAtomic},
		{"max_dest_rd_atomic 0", Init, RTR, rcInitToRTR, func(a *Attr) { a.MaxDestRdAtomic = 0 }, 0},
		{"min_rnr_timer 31", Init, RTR, rcInitToRTR, func(a *Attr) { a.MinRNRTimer = 31 }, 0},
		{"min_rnr_timer 32", Init, RTR, rcInitToRTR, func(a *Attr) { a.MinRNRTimer = 32 }, AttrMinRNRTimer},
		{"dest_qpn 25 bits", Init, RTR, rcInitToRTR, func(a *Attr) { a.DestQPN = 1 << 24 }, AttrDestQPN},
		{"rq_psn 25 bits (masked, rxe_qp_from_attr)", Init, RTR, rcInitToRTR, func(a *Attr) { a.RQPSN = 0x1000000 }, 0},
		{"AV without GID", Init, RTR, rcInitToRTR, func(a *Attr) { a.AV.DGID = netip.Addr{} }, AttrAV},
		{"AV unspecified GID", Init, RTR, rcInitToRTR, func(a *Attr) { a.AV.DGID = netip.IPv6Unspecified() }, AttrAV},
		{"AV IPv6 GID", Init, RTR, rcInitToRTR, func(a *Attr) { a.AV.DGID = netip.MustParseAddr("::1") }, 0},
		{"AV IPv4-mapped GID", Init, RTR, rcInitToRTR, func(a *Attr) { a.AV.DGID = netip.MustParseAddr("::ffff:127.0.0.1") }, 0},
		{"AV flow label 21 bits", Init, RTR, rcInitToRTR, func(a *Attr) { a.AV.FlowLabel = 1 << 20 }, AttrAV},
		{"AV sl 16", Init, RTR, rcInitToRTR, func(a *Attr) { a.AV.SL = 16 }, AttrAV},
		{"AV port 2", Init, RTR, rcInitToRTR, func(a *Attr) { a.AV.PortNum = 2 }, AttrAV},
		{"alt path bad timeout", Init, RTR, rcInitToRTR | AttrAltPath, func(a *Attr) { a.AltTimeout = 40 }, AttrAltPath},
		{"alt path bad port", Init, RTR, rcInitToRTR | AttrAltPath, func(a *Attr) { a.AltPortNum = 0 }, AttrAltPath},
		{"alt path bad AV", Init, RTR, rcInitToRTR | AttrAltPath, func(a *Attr) { a.AltAV.DGID = netip.Addr{} }, AttrAltPath},
		{"alt path bad pkey", Init, RTR, rcInitToRTR | AttrAltPath, func(a *Attr) { a.AltPKeyIndex = 1 }, AttrAltPath},
		{"port 0", Reset, Init, rcResetToInit, func(a *Attr) { a.PortNum = 0 }, AttrPort},
		{"port 2", Reset, Init, rcResetToInit, func(a *Attr) { a.PortNum = 2 }, AttrPort},
		{"pkey index 1", Reset, Init, rcResetToInit, func(a *Attr) { a.PKeyIndex = 1 }, AttrPKeyIndex},
		{"access flags unknown bit", Reset, Init, rcResetToInit, func(a *Attr) { a.AccessFlags |= 1 << 4 }, AttrAccessFlags},
		{"access flags zero", Reset, Init, rcResetToInit, func(a *Attr) { a.AccessFlags = 0 }, 0},
		{"path mig state 3", RTS, RTS, AttrPathMigState, func(a *Attr) { a.PathMigState = 3 }, AttrPathMigState},
		{"state 7", RTS, RTS, AttrState, func(a *Attr) { a.State = 7 }, AttrState},
		{"cur state 9", RTS, RTS, AttrState | AttrCurState, func(a *Attr) { a.CurState = 9 }, AttrCurState},
		{"cur state mismatch", RTS, RTS, AttrState | AttrCurState, func(a *Attr) { a.CurState = RTR }, AttrCurState},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := goodAttr(c.cur, c.to)
			c.mutate(a)
			before := *a
			err := CheckModify(RC, c.cur, a, c.mask)
			require.Equal(t, before, *a, "CheckModify must not change its input")
			if c.bad == 0 {
				require.NoError(t, err)
				return
			}
			var me *ModifyError
			require.ErrorAs(t, err, &me, "want an error on %v", c.bad)
			require.Equal(t, c.bad, me.Attr, "%v", err)
			require.True(t, errors.Is(err, ErrAttrValue) || errors.Is(err, ErrCurStateMismatch), "%v", err)
			require.Contains(t, err.Error(), attrNames[c.bad])
		})
	}
}

func TestCheckModifyBadInput(t *testing.T) {
	err := CheckModify(Type(0), Reset, goodAttr(Reset, Init), AttrState)
	require.ErrorIs(t, err, ErrBadQPType)
	require.Contains(t, err.Error(), "Type(0)")

	err = CheckModify(RC, State(42), goodAttr(Reset, Init), AttrState)
	require.ErrorIs(t, err, ErrAttrValue)

	// nil attributes read as zero values (so STATE means RESET); an empty
	// mask is the move to the same state (TestSameStateModifyFollowsTheKernelTable).
	require.NoError(t, CheckModify(RC, RTS, nil, 0))
	require.ErrorIs(t, CheckModify(RC, RTR, nil, 0), ErrInvalidTransition)
	require.NoError(t, CheckModify(RC, RTS, nil, AttrAccessFlags))
	require.NoError(t, CheckModify(RC, RTS, nil, AttrState))
	err = CheckModify(RC, Reset, nil, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags)
	require.ErrorIs(t, err, ErrAttrNotAllowed)
	err = CheckModify(RC, Init, nil, AttrPort)
	require.ErrorIs(t, err, ErrAttrValue)
	require.Contains(t, err.Error(), "IBV_QP_PORT 0 out of range")
}

func TestCheckModifyCustomLimits(t *testing.T) {
	l := DefaultLimits
	l.MaxMTU = MTU1024
	l.PKeyTableLen = 4
	a := goodAttr(Init, RTR)
	a.PathMTU = MTU2048
	mask := AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer
	err := l.CheckModify(RC, Init, a, mask)
	require.ErrorIs(t, err, ErrAttrValue)
	require.Contains(t, err.Error(), "exceeds the port MTU 1024")
	a.PathMTU = MTU1024
	require.NoError(t, l.CheckModify(RC, Init, a, mask))
	a.PKeyIndex = 3
	require.NoError(t, l.CheckModify(RC, Init, a, mask|AttrPKeyIndex))
	require.Error(t, DefaultLimits.CheckModify(RC, Init, a, mask|AttrPKeyIndex))
}

func TestCheckCap(t *testing.T) {
	l := DefaultLimits
	ok := Cap{MaxSendWR: 0x4000, MaxRecvWR: 0x4000, MaxSendSGE: 32, MaxRecvSGE: 32, MaxInlineData: 400}
	require.NoError(t, l.CheckCap(ok, false))
	for _, c := range []struct {
		mut  func(*Cap)
		srq  bool
		name string
	}{
		{func(c *Cap) { c.MaxSendWR++ }, false, "max_send_wr"},
		{func(c *Cap) { c.MaxRecvWR++ }, false, "max_recv_wr"},
		{func(c *Cap) { c.MaxSendSGE++ }, false, "max_send_sge"},
		{func(c *Cap) { c.MaxRecvSGE++ }, false, "max_recv_sge"},
		{func(c *Cap) { c.MaxInlineData++ }, false, "max_inline_data"},
	} {
		bad := ok
		c.mut(&bad)
		err := l.CheckCap(bad, c.srq)
		require.ErrorIs(t, err, ErrCapRange)
		require.Contains(t, err.Error(), c.name)
	}
	// With an SRQ the receive sizes are not the QP's.
	require.NoError(t, l.CheckCap(Cap{MaxRecvWR: 1 << 30, MaxRecvSGE: 1 << 30}, true))
}

func TestNextState(t *testing.T) {
	a := &Attr{State: RTS}
	require.Equal(t, RTS, NextState(RTR, a, AttrState))
	require.Equal(t, RTR, NextState(RTR, a, AttrSQPSN))
	require.Equal(t, RTR, NextState(RTR, nil, AttrState))
}

func BenchmarkCheckModify(b *testing.B) {
	a := goodAttr(Init, RTR)
	mask := AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer
	b.ReportAllocs()
	for b.Loop() {
		if err := CheckModify(RC, Init, a, mask); err != nil {
			b.Fatal(err)
		}
	}
}
