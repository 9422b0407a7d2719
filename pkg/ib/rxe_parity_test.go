package ib_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/stretchr/testify/require"
)

// The verbs called the way a C program calls rdma_rxe's must succeed or
// fail the way rxe's do (Linux 6.1, drivers/infiniband/sw/rxe): each
// case names the rxe function it follows.

// modifyToRTS drives q from RESET to RTS towards rq with explicit Modify
// calls (no ConnectQP), giving rq_psn and sq_psn as the caller has them.
func modifyToRTS(t *testing.T, q *ib.QP, r *peer, rq *ib.QP, rqPSN, sqPSN ib.PSN) {
	t.Helper()
	require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, AccessFlags: remoteAll},
		ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags))
	require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSRTR, PathMTU: ib.MTU1024, DestQPN: rq.Num(), RQPSN: rqPSN,
		MaxDestRdAtomic: 4, MinRNRTimer: 1, AV: ib.AddrVector{DGID: r.addr, PortNum: 1, DestPort: r.dev.UDPPort()}},
		ib.AttrState|ib.AttrAV|ib.AttrPathMTU|ib.AttrDestQPN|ib.AttrRQPSN|ib.AttrMaxDestRdAtomic|ib.AttrMinRNRTimer))
	require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, SQPSN: sqPSN, MaxRdAtomic: 4},
		ib.AttrState|ib.AttrTimeout|ib.AttrRetryCnt|ib.AttrRNRRetry|ib.AttrSQPSN|ib.AttrMaxQPRdAtomic))
}

// rq_psn and sq_psn wider than 24 bits are not refused: rxe_qp_from_attr
// keeps their low 24 bits (attr->sq_psn & BTH_PSN_MASK), so a C program
// that sets sq_psn = lrand48() connects. rxed refused them with
// ErrAttrValue, and such a program could not connect at all.
func TestModifyKeepsThe24BitsOfAPSN(t *testing.T) {
	a, qa, b, qb := testPair(t)
	psn := ib.PSN(newPSN())
	wide := psn | 0x5A000000 // what lrand48() may give
	modifyToRTS(t, qa, b, qb, wide, wide)
	modifyToRTS(t, qb, a, qa, wide, wide)
	for _, q := range []*ib.QP{qa, qb} {
		attr, _, err := q.Query()
		require.NoError(t, err)
		require.Equal(t, psn, attr.SQPSN, "sq_psn reads back masked")
		require.Equal(t, psn, attr.RQPSN, "rq_psn reads back masked")
	}
	requireWorks(t, a, qa, b, qb)
}

// A UD SEND longer than the port's MTU is posted, sends nothing and
// completes with SUCCESS; the QP stays in RTS and its next message
// arrives. IBA C10-93.1.1 forbids a packet and an error for it, and
// rxe_requester fakes a successful UD send; rxe's validate_send_wr does
// not refuse it at post time. rxed refused one over 4096 bytes at post
// (ErrMsgTooLong) and failed a shorter one with LOC_LEN_ERR, taking the
// QP to ERR.
func TestUDSendLongerThanTheMTUCompletesUnsent(t *testing.T) {
	a, qa, b, qb := udPair(t, "10.11.9.1", "10.11.9.2")
	ah, err := a.pd.CreateAH(ib.AHAttr{DGID: b.addr, DestPort: b.dev.UDPPort(), PortNum: 1})
	require.NoError(t, err)
	send := func(id uint64, n int) ib.SendWR {
		wr := ib.SendWR{ID: id, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: []ib.SGE{a.sge(0, n)}}
		ib.UDSend(&wr, ah, qb.Num(), 0x1111)
		return wr
	}
	require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 50, SGL: []ib.SGE{b.sge(0, 40+64)}}))
	require.NoError(t, qa.PostSend(send(1, 4097), send(2, 64)))
	requireWC(t, a, 1, ib.WCSuccess)
	requireWC(t, a, 2, ib.WCSuccess)
	wc := requireWC(t, b, 50, ib.WCSuccess)
	require.Equal(t, uint32(40+64), wc.ByteLen, "only the second message arrived")
	require.Equal(t, ib.QPSRTS, qa.State())
	require.Equal(t, 0, b.cq.Len())
}

// An atomic's local SGEs need only hold the 8 bytes of its result, in as
// many SGEs as the QP allows (rxe's validate_send_wr: length < 8 is
// EINVAL, nothing more); the original value is scattered over them as
// rxe's completer copies it (copy_data over the WQE's SGEs). rxed
// refused anything but one SGE of exactly 8 bytes with ErrAtomicSGE.
func TestAtomicResultScattersOverItsSGEs(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	target := b.buf[1024:1032]
	binary.NativeEndian.PutUint64(target, 0x1122334455667788)
	fetchAdd := func(id uint64, sgl ...ib.SGE) {
		require.NoError(t, qa.PostSend(ib.SendWR{ID: id, Opcode: ib.WRAtomicFetchAndAdd, Flags: ib.SendSignaled,
			SGL: sgl, RemoteAddr: b.mr.IOVA() + 1024, RKey: b.mr.RKey(), CompareAdd: 1}))
		requireWC(t, a, id, ib.WCSuccess)
	}
	// Two 4-byte SGEs apart: the value's first half in one, its second in the other.
	fetchAdd(1, a.sge(100, 4), a.sge(200, 4))
	var got [8]byte
	copy(got[:4], a.buf[100:104])
	copy(got[4:], a.buf[200:204])
	require.Equal(t, uint64(0x1122334455667788), binary.NativeEndian.Uint64(got[:]))
	// One 16-byte SGE: the value in its first 8 bytes, the rest untouched.
	copy(a.buf[300:316], bytes.Repeat([]byte{0xEE}, 16))
	fetchAdd(2, a.sge(300, 16))
	require.Equal(t, uint64(0x1122334455667789), binary.NativeEndian.Uint64(a.buf[300:308]))
	require.Equal(t, bytes.Repeat([]byte{0xEE}, 8), a.buf[308:316])
	require.Equal(t, uint64(0x112233445566778A), binary.NativeEndian.Uint64(target))
	// Fewer than 8 bytes is still refused, before anything is queued.
	requirePostError(t, qa.PostSend(ib.SendWR{Opcode: ib.WRAtomicFetchAndAdd, SGL: []ib.SGE{a.sge(0, 4), a.sge(8, 3)},
		RemoteAddr: b.mr.IOVA() + 1024, RKey: b.mr.RKey()}), 0, ib.ErrAtomicSGE)
	requireWorks(t, a, qa, b, qb)
}

// ibv_create_srq as rxe checks it (rxe_srq_chk_init): max_sge 0 is raised
// to one SGE, srq_limit is not held against max_wr (libibverbs: it is
// irrelevant to ibv_create_srq; rxe_srq_from_init arms it as given),
// max_wr 0 and max_sge above the device's are EINVAL. rxed refused the
// first two.
func TestCreateSRQAsRxeChecksIt(t *testing.T) {
	a, _, _, _ := testPair(t)
	srq, err := a.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 4, MaxSGE: 0, Limit: 5})
	require.NoError(t, err)
	require.Equal(t, 5, srq.Limit())
	require.NoError(t, srq.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{a.sge(0, 8)}}), "max_sge 0 takes one SGE")
	requirePostError(t, srq.PostRecv(ib.RecvWR{ID: 2, SGL: []ib.SGE{a.sge(0, 8), a.sge(8, 8)}}), 0, ib.ErrTooManySGE)
	require.NoError(t, srq.Destroy())
	for _, bad := range []ib.SRQInitAttr{{MaxWR: 0, MaxSGE: 1}, {MaxWR: ib.MaxSRQWR + 1, MaxSGE: 1}, {MaxWR: 4, MaxSGE: ib.MaxSRQSGE + 1}} {
		_, err := a.pd.CreateSRQ(bad)
		require.Error(t, err, "%+v", bad)
	}
}

// Every refusal of a creating or modifying verb matches a sentinel of
// this package, so a program needs only pkg/ib to tell them apart (where
// rxe answers EINVAL or EOPNOTSUPP), and its message names this package
// once. CreateQP's missing CQ and unknown type matched nothing; its caps
// (rxe_qp_chk_cap), CreateSRQ's sizes and limits (rxe_srq_chk_init,
// rxe_srq_chk_attr), AllocMW's type and a modify's IBV_QP_CUR_STATE
// matched only pkg/qp's or pkg/mr's; SRQ.ArmLimit's message was pkg/qp's,
// and ArmLimit and PostRecv on a destroyed SRQ failed with pkg/qp's
// "receive queue destroyed" instead of ErrDestroyed.
func TestVerbRefusalsMatchIbSentinels(t *testing.T) {
	a, qa, _, _ := testPair(t)
	type refusal struct {
		name string
		err  error
		is   error
	}
	var cases []refusal
	add := func(name string, err, is error) { cases = append(cases, refusal{name, err, is}) }
	createQP := func(attr ib.QPInitAttr) error {
		q, err := a.pd.CreateQP(attr)
		if err == nil {
			q.Destroy()
		}
		return err
	}
	add("CreateQP without a receive CQ", createQP(ib.QPInitAttr{Type: ib.RC, SendCQ: a.cq}), ib.ErrMissingCQ)
	add("CreateQP without a send CQ", createQP(ib.QPInitAttr{Type: ib.RC, RecvCQ: a.cq}), ib.ErrMissingCQ)
	add("CreateQP of an unknown type", createQP(ib.QPInitAttr{Type: ib.QPType(9), SendCQ: a.cq, RecvCQ: a.cq}), ib.ErrBadQPType)
	for _, c := range []ib.QPCap{{MaxSendWR: 0x4001}, {MaxRecvWR: 0x4001}, {MaxSendSGE: 33}, {MaxRecvSGE: 33}, {MaxInlineData: 401}} {
		add(fmt.Sprintf("CreateQP cap %+v", c), createQP(ib.QPInitAttr{Type: ib.RC, SendCQ: a.cq, RecvCQ: a.cq, Cap: c}), ib.ErrCapRange)
	}
	_, err := a.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 0, MaxSGE: 1})
	add("CreateSRQ max_wr 0", err, ib.ErrSRQSize)
	_, err = a.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 4, MaxSGE: ib.MaxSRQSGE + 1})
	add("CreateSRQ max_sge", err, ib.ErrSRQSize)
	_, err = a.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 4, MaxSGE: 1, Limit: -1})
	add("CreateSRQ negative limit", err, ib.ErrSRQLimit)
	srq, err := a.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 4, MaxSGE: 1})
	require.NoError(t, err)
	add("ArmLimit above max_wr", srq.ArmLimit(5), ib.ErrSRQLimit)
	require.NoError(t, srq.Destroy())
	add("ArmLimit on a destroyed SRQ", srq.ArmLimit(1), ib.ErrDestroyed)
	add("PostRecv on a destroyed SRQ", srq.PostRecv(ib.RecvWR{ID: 1}), ib.ErrDestroyed)
	_, err = a.pd.AllocMW(ib.MWType(3))
	add("AllocMW of an unknown type", err, ib.ErrInvalidArgument)
	add("Modify with a wrong IBV_QP_CUR_STATE", qa.Modify(&ib.QPAttr{State: ib.QPSErr, CurState: ib.QPSRTS}, ib.AttrState|ib.AttrCurState),
		ib.ErrCurStateMismatch)
	for _, c := range cases {
		require.ErrorIs(t, c.err, c.is, c.name)
		require.Regexp(t, `^ib: `, c.err.Error(), c.name)
		require.NotRegexp(t, doubledPrefix, c.err.Error(), c.name)
	}
}

// A QP created with max_send_wr and max_recv_wr 0 holds no work request:
// rxe_queue_init gives it queues of one slot, which its full test keeps
// free, so every ibv_post_send and ibv_post_recv fails (ENOMEM) and
// ibv_query_qp reports 0. rxed took one send and one receive (and
// reported max_send_wr 1).
func TestQPWithZeroQueuesHoldsNoWorkRequest(t *testing.T) {
	a, _, b, qb := testPair(t)
	q, err := a.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: a.cq, RecvCQ: a.cq})
	require.NoError(t, err)
	connectBoth(a, q, b, qb)
	requirePostError(t, q.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRSend, Flags: ib.SendInline}), 0, ib.ErrSendFull)
	requirePostError(t, q.PostRecv(ib.RecvWR{ID: 2}), 0, ib.ErrRecvFull)
	attr, init, err := q.Query()
	require.NoError(t, err)
	require.Equal(t, ib.QPCap{}, attr.Cap)
	require.Equal(t, ib.QPCap{}, init.Cap)
	// ERR and RESET have nothing to flush; nothing completes.
	require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSErr}, ib.AttrState))
	require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
	require.Equal(t, 0, a.cq.Len())
	require.NoError(t, q.Destroy())
}

// ibv_bind_mw refuses what libibverbs (a window of another type than 1)
// and rdma-core's rxe_bind_mw (an address or length without a region, a
// zero-based window, a region of another PD) check before posting: the
// call fails with EINVAL or EPERM, nothing is posted and the QP stays in
// RTS. rxed posted them all (the type and nil checks aside, which matched
// no sentinel): the bind failed at execution with MW_BIND_ERR and took
// the QP to ERR.
func TestBindMWRefusesWhatRxeBindMWRefuses(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	region, err := a.pd.RegMR(a.buf[:4096], ib.AccessLocalWrite|ib.AccessMWBind)
	require.NoError(t, err)
	otherPD, err := a.dev.AllocPD()
	require.NoError(t, err)
	foreign, err := otherPD.RegMR(a.buf[4096:8192], ib.AccessLocalWrite|ib.AccessMWBind)
	require.NoError(t, err)
	mw1, err := a.pd.AllocMW(ib.MWType1)
	require.NoError(t, err)
	mw2, err := a.pd.AllocMW(ib.MWType2)
	require.NoError(t, err)
	cases := []struct {
		name string
		mw   *ib.MW
		bind ib.MWBind
		is   error
	}{
		{"nil window", nil, ib.MWBind{}, ib.ErrInvalidArgument},
		{"type 2 window", mw2, ib.MWBind{MR: region, Addr: region.IOVA(), Length: 64}, ib.ErrInvalidArgument},
		{"length without a region", mw1, ib.MWBind{Length: 64}, ib.ErrInvalidArgument},
		{"address without a region", mw1, ib.MWBind{Addr: region.IOVA()}, ib.ErrInvalidArgument},
		{"zero based", mw1, ib.MWBind{MR: region, Length: 64, Access: ib.AccessRemoteRead | ib.AccessZeroBased}, ib.ErrInvalidArgument},
		{"region of another PD", mw1, ib.MWBind{MR: foreign, Addr: foreign.IOVA(), Length: 64}, ib.ErrPDMismatch},
	}
	for _, c := range cases {
		key := mw1.RKey()
		_, err := qa.BindMW(c.mw, c.bind)
		require.ErrorIs(t, err, c.is, c.name)
		require.Regexp(t, `^ib: BindMW: `, err.Error(), c.name)
		require.Equal(t, ib.QPSRTS, qa.State(), c.name)
		require.Equal(t, key, mw1.RKey(), c.name)
		require.False(t, mw1.Bound(), c.name)
	}
	require.Equal(t, 0, a.cq.Len(), "nothing was posted")
	requireWorks(t, a, qa, b, qb)
	require.NoError(t, foreign.Dereg())
	require.NoError(t, otherPD.Dealloc())
}

// A Modify without IBV_QP_STATE on an RTR QP is the move RTR->RTR, which
// the kernel's qp_state_table (ib_modify_qp_is_ok, from rxe_qp_chk_attr)
// does not have: EINVAL on rxe, ErrInvalidTransition here, the QP left in
// RTR. rxed let Modify(nil, 0) through. On RTS, whose table entry exists,
// nil attributes with a mask read as zero values: the engine's worker
// dereferenced nil and the process died.
func TestModifyWithoutStateOnRTRIsInvalid(t *testing.T) {
	_, qa, b, qb := testPair(t)
	require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, AccessFlags: remoteAll},
		ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags))
	require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSRTR, PathMTU: ib.MTU1024, DestQPN: qb.Num(), RQPSN: 1,
		MaxDestRdAtomic: 4, MinRNRTimer: 1, AV: ib.AddrVector{DGID: b.addr, PortNum: 1, DestPort: b.dev.UDPPort()}},
		ib.AttrState|ib.AttrAV|ib.AttrPathMTU|ib.AttrDestQPN|ib.AttrRQPSN|ib.AttrMaxDestRdAtomic|ib.AttrMinRNRTimer))
	for _, c := range []struct {
		attr *ib.QPAttr
		mask ib.QPAttrMask
	}{{nil, 0}, {&ib.QPAttr{}, 0}, {&ib.QPAttr{MinRNRTimer: 3}, ib.AttrMinRNRTimer}, {&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState}} {
		require.ErrorIs(t, qa.Modify(c.attr, c.mask), ib.ErrInvalidTransition, "%+v", c)
		require.Equal(t, ib.QPSRTR, qa.State())
	}
	require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4},
		ib.AttrState|ib.AttrTimeout|ib.AttrRetryCnt|ib.AttrRNRRetry|ib.AttrSQPSN|ib.AttrMaxQPRdAtomic))
	require.NoError(t, qa.Modify(nil, 0))
	require.NoError(t, qa.Modify(nil, ib.AttrMinRNRTimer))
	attr, _, err := qa.Query()
	require.NoError(t, err)
	require.Equal(t, ib.QPSRTS, attr.State)
	require.Zero(t, attr.MinRNRTimer)
}

// ibv_query_qp on rxe reads max_rd_atomic and max_dest_rd_atomic back
// rounded up to a power of two: rxe_qp_from_attr stores
// roundup_pow_of_two of each (0 stays 0) and rxe_qp_to_attr copies
// qp->attr. rxed reported them as given.
func TestQueryReportsRdAtomicDepthsRoundedUp(t *testing.T) {
	a, _, b, qb := testPair(t)
	for _, c := range []struct{ give, want uint8 }{{0, 0}, {1, 1}, {3, 4}, {5, 8}, {16, 16}, {100, 128}, {128, 128}} {
		q := a.createQP(ib.RC)
		require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, AccessFlags: remoteAll},
			ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags))
		require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSRTR, PathMTU: ib.MTU1024, DestQPN: qb.Num(), RQPSN: 1,
			MaxDestRdAtomic: c.give, AV: ib.AddrVector{DGID: b.addr, PortNum: 1, DestPort: b.dev.UDPPort()}},
			ib.AttrState|ib.AttrAV|ib.AttrPathMTU|ib.AttrDestQPN|ib.AttrRQPSN|ib.AttrMaxDestRdAtomic|ib.AttrMinRNRTimer))
		require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: c.give},
			ib.AttrState|ib.AttrTimeout|ib.AttrRetryCnt|ib.AttrRNRRetry|ib.AttrSQPSN|ib.AttrMaxQPRdAtomic))
		attr, _, err := q.Query()
		require.NoError(t, err)
		require.Equal(t, c.want, attr.MaxRdAtomic, "max_rd_atomic %d", c.give)
		require.Equal(t, c.want, attr.MaxDestRdAtomic, "max_dest_rd_atomic %d", c.give)
		require.NoError(t, q.Destroy())
	}
}
