package ib_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// The numeric values of the verbs enums are libibverbs' (verbs.h), so
// numbers read from a C program, a capture or a log mean the same here.
func TestEnumValuesAreLibibverbs(t *testing.T) {
	ints := []struct {
		name      string
		got, want int
	}{
		{"IBV_QPT_RC", int(ib.RC), 2}, {"IBV_QPT_UC", int(ib.UC), 3}, {"IBV_QPT_UD", int(ib.UD), 4},
		{"IBV_QPS_RESET", int(ib.QPSReset), 0}, {"IBV_QPS_INIT", int(ib.QPSInit), 1}, {"IBV_QPS_RTR", int(ib.QPSRTR), 2},
		{"IBV_QPS_RTS", int(ib.QPSRTS), 3}, {"IBV_QPS_SQD", int(ib.QPSSQD), 4}, {"IBV_QPS_SQE", int(ib.QPSSQE), 5},
		{"IBV_QPS_ERR", int(ib.QPSErr), 6},
		{"IBV_MTU_256", int(ib.MTU256), 1}, {"IBV_MTU_4096", int(ib.MTU4096), 5},
		{"IBV_WR_RDMA_WRITE", int(ib.WRRDMAWrite), 0}, {"IBV_WR_RDMA_WRITE_WITH_IMM", int(ib.WRRDMAWriteWithImm), 1},
		{"IBV_WR_SEND", int(ib.WRSend), 2}, {"IBV_WR_SEND_WITH_IMM", int(ib.WRSendWithImm), 3},
		{"IBV_WR_RDMA_READ", int(ib.WRRDMARead), 4}, {"IBV_WR_ATOMIC_CMP_AND_SWP", int(ib.WRAtomicCmpAndSwp), 5},
		{"IBV_WR_ATOMIC_FETCH_AND_ADD", int(ib.WRAtomicFetchAndAdd), 6}, {"IBV_WR_LOCAL_INV", int(ib.WRLocalInv), 7},
		{"IBV_WR_BIND_MW", int(ib.WRBindMW), 8}, {"IBV_WR_SEND_WITH_INV", int(ib.WRSendWithInv), 9},
		{"IBV_WR_FLUSH", int(ib.WRFlush), 14}, {"IBV_WR_ATOMIC_WRITE", int(ib.WRAtomicWrite), 15},
		{"IBV_SEND_FENCE", int(ib.SendFence), 1}, {"IBV_SEND_SIGNALED", int(ib.SendSignaled), 2},
		{"IBV_SEND_SOLICITED", int(ib.SendSolicited), 4}, {"IBV_SEND_INLINE", int(ib.SendInline), 8},
		{"IBV_ACCESS_LOCAL_WRITE", int(ib.AccessLocalWrite), 1}, {"IBV_ACCESS_REMOTE_WRITE", int(ib.AccessRemoteWrite), 2},
		{"IBV_ACCESS_REMOTE_READ", int(ib.AccessRemoteRead), 4}, {"IBV_ACCESS_REMOTE_ATOMIC", int(ib.AccessRemoteAtomic), 8},
		{"IBV_ACCESS_MW_BIND", int(ib.AccessMWBind), 16}, {"IBV_ACCESS_ZERO_BASED", int(ib.AccessZeroBased), 32},
		{"IBV_ACCESS_FLUSH_GLOBAL", int(ib.AccessFlushGlobal), 1 << 8}, {"IBV_ACCESS_FLUSH_PERSISTENT", int(ib.AccessFlushPersistent), 1 << 9},
		{"QP REMOTE_WRITE", int(ib.AccessRemoteWrite), 2}, {"QP REMOTE_READ", int(ib.AccessRemoteRead), 4},
		{"QP REMOTE_ATOMIC", int(ib.AccessRemoteAtomic), 8},
		{"IBV_QP_STATE", int(ib.AttrState), 1 << 0}, {"IBV_QP_CUR_STATE", int(ib.AttrCurState), 1 << 1},
		{"IBV_QP_ACCESS_FLAGS", int(ib.AttrAccessFlags), 1 << 3}, {"IBV_QP_PKEY_INDEX", int(ib.AttrPKeyIndex), 1 << 4},
		{"IBV_QP_PORT", int(ib.AttrPort), 1 << 5}, {"IBV_QP_QKEY", int(ib.AttrQKey), 1 << 6}, {"IBV_QP_AV", int(ib.AttrAV), 1 << 7},
		{"IBV_QP_PATH_MTU", int(ib.AttrPathMTU), 1 << 8}, {"IBV_QP_TIMEOUT", int(ib.AttrTimeout), 1 << 9},
		{"IBV_QP_RETRY_CNT", int(ib.AttrRetryCnt), 1 << 10}, {"IBV_QP_RNR_RETRY", int(ib.AttrRNRRetry), 1 << 11},
		{"IBV_QP_RQ_PSN", int(ib.AttrRQPSN), 1 << 12}, {"IBV_QP_MAX_QP_RD_ATOMIC", int(ib.AttrMaxQPRdAtomic), 1 << 13},
		{"IBV_QP_MIN_RNR_TIMER", int(ib.AttrMinRNRTimer), 1 << 15}, {"IBV_QP_SQ_PSN", int(ib.AttrSQPSN), 1 << 16},
		{"IBV_QP_MAX_DEST_RD_ATOMIC", int(ib.AttrMaxDestRdAtomic), 1 << 17}, {"IBV_QP_PATH_MIG_STATE", int(ib.AttrPathMigState), 1 << 18},
		{"IBV_QP_CAP", int(ib.AttrCap), 1 << 19}, {"IBV_QP_DEST_QPN", int(ib.AttrDestQPN), 1 << 20},
		{"IBV_WC_SEND", int(ib.WCSend), 0}, {"IBV_WC_RDMA_WRITE", int(ib.WCRDMAWrite), 1}, {"IBV_WC_RDMA_READ", int(ib.WCRDMARead), 2},
		{"IBV_WC_COMP_SWAP", int(ib.WCCompSwap), 3}, {"IBV_WC_FETCH_ADD", int(ib.WCFetchAdd), 4}, {"IBV_WC_BIND_MW", int(ib.WCBindMW), 5},
		{"IBV_WC_LOCAL_INV", int(ib.WCLocalInv), 6}, {"IBV_WC_RECV", int(ib.WCRecv), 128},
		{"IBV_WC_RECV_RDMA_WITH_IMM", int(ib.WCRecvRDMAWithImm), 129},
		{"IBV_WC_GRH", int(ib.WCWithGRH), 1}, {"IBV_WC_WITH_IMM", int(ib.WCWithImm), 2}, {"IBV_WC_WITH_INV", int(ib.WCWithInv), 8},
		{"IBV_EVENT_CQ_ERR", int(ib.EventCQErr), 0}, {"IBV_EVENT_QP_FATAL", int(ib.EventQPFatal), 1},
		{"IBV_EVENT_PORT_ACTIVE", int(ib.EventPortActive), 9}, {"IBV_EVENT_SRQ_LIMIT_REACHED", int(ib.EventSRQLimitReached), 15},
		{"IBV_PORT_ACTIVE", int(ib.PortActive), 4}, {"IBV_PORT_DOWN", int(ib.PortDown), 1},
		{"IBV_MW_TYPE_1", int(ib.MWType1), 1}, {"IBV_MW_TYPE_2", int(ib.MWType2), 2},
	}
	for _, c := range ints {
		require.Equal(t, c.want, c.got, c.name)
	}
}

// Completion statuses print with libibverbs' enumerator names and
// ibv_wc_status_str's descriptions.
func TestWCStatusNames(t *testing.T) {
	cases := []struct {
		s          ib.WCStatus
		value      int
		name, desc string
	}{
		{ib.WCSuccess, 0, "SUCCESS", "success"},
		{ib.WCLocLenErr, 1, "LOC_LEN_ERR", "local length error"},
		{ib.WCLocQPOpErr, 2, "LOC_QP_OP_ERR", "local QP operation error"},
		{ib.WCLocProtErr, 4, "LOC_PROT_ERR", "local protection error"},
		{ib.WCWRFlushErr, 5, "WR_FLUSH_ERR", "Work Request Flushed Error"},
		{ib.WCMWBindErr, 6, "MW_BIND_ERR", "memory management operation error"},
		{ib.WCBadRespErr, 7, "BAD_RESP_ERR", "bad response error"},
		{ib.WCLocAccessErr, 8, "LOC_ACCESS_ERR", "local access error"},
		{ib.WCRemInvReqErr, 9, "REM_INV_REQ_ERR", "remote invalid request error"},
		{ib.WCRemAccessErr, 10, "REM_ACCESS_ERR", "remote access error"},
		{ib.WCRemOpErr, 11, "REM_OP_ERR", "remote operation error"},
		{ib.WCRetryExcErr, 12, "RETRY_EXC_ERR", "transport retry counter exceeded"},
		{ib.WCRNRRetryExcErr, 13, "RNR_RETRY_EXC_ERR", "RNR retry counter exceeded"},
		{ib.WCFatalErr, 19, "FATAL_ERR", "fatal error"},
		{ib.WCGeneralErr, 21, "GENERAL_ERR", "general error"},
	}
	for _, c := range cases {
		require.Equal(t, c.value, int(c.s), c.name)
		require.Equal(t, c.name, c.s.String())
		require.Equal(t, c.desc, c.s.Description())
	}
	require.Equal(t, "WCStatus(99)", ib.WCStatus(99).String())
	for ev, name := range map[ib.EventType]string{ib.EventCQErr: "CQ_ERR", ib.EventQPFatal: "QP_FATAL",
		ib.EventPortActive: "PORT_ACTIVE", ib.EventSRQLimitReached: "SRQ_LIMIT_REACHED", 77: "EVENT_UNKNOWN"} {
		require.Equal(t, name, ev.String())
	}
}

// QueryDevice and QueryPort report rdma_rxe's limits (rxe_param.h), and
// the limits they report are the ones enforced.
func TestQueryDeviceAndPortLimits(t *testing.T) {
	net := transport.NewMemNetwork()
	p := openPeer(net, "10.8.0.1")
	defer p.close()
	a := p.dev.QueryDevice()
	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"max_mr_size", a.MaxMRSize, ^uint64(0)}, {"page_size_cap", a.PageSizeCap, 0xfffff000},
		{"max_qp", uint64(a.MaxQP), 0x10000}, {"max_qp_wr", uint64(a.MaxQPWR), 0x4000},
		{"max_sge", uint64(a.MaxSGE), 32}, {"max_sge_rd", uint64(a.MaxSGERd), 32},
		{"max_cq", uint64(a.MaxCQ), 16384}, {"max_cqe", uint64(a.MaxCQE), 1<<15 - 1},
		{"max_pd", uint64(a.MaxPD), 0x7ffc}, {"max_qp_rd_atom", uint64(a.MaxQPRdAtom), 128},
		{"max_qp_init_rd_atom", uint64(a.MaxQPInitRdAtom), 128}, {"max_res_rd_atom", uint64(a.MaxResRdAtom), 0x3f000},
		{"max_srq_wr", uint64(a.MaxSRQWR), 0x4000}, {"max_srq_sge", uint64(a.MaxSRQSGE), 27},
		{"max_pkeys", uint64(a.MaxPKeys), 64}, {"local_ca_ack_delay", uint64(a.LocalCAAckDelay), 15},
		{"phys_port_cnt", uint64(a.PhysPortCnt), 1}, {"max_inline_data", uint64(a.MaxInlineData), 400},
		{"max_fast_reg_page_list_len", uint64(a.MaxFastRegPageList), 512}, {"atomic_cap", uint64(a.AtomicCap), 1},
		// RXE_DEVICE_CAP_FLAGS of 6.1 as ibv_query_device reads it (the
		// helper session that added SRQ resizing found it 0: a program
		// checking IBV_DEVICE_SRQ_RESIZE would not resize).
		{"device_cap_flags", a.DeviceCapFlags, 0x1a23c76},
	} {
		require.Equal(t, c.want, c.got, c.name)
	}
	require.NotZero(t, a.NodeGUID)

	port, err := p.dev.QueryPort(1)
	require.NoError(t, err)
	require.Equal(t, ib.PortActive, port.State)
	require.Equal(t, ib.MTU4096, port.MaxMTU)
	require.Equal(t, uint64(0x800000), port.MaxMsgSz)
	require.Equal(t, 1024, port.GIDTblLen)
	require.Equal(t, "Ethernet", port.LinkLayer)
	for _, bad := range []uint8{0, 2} {
		_, err := p.dev.QueryPort(bad)
		require.Error(t, err, "port %d", bad)
	}

	// The reported limits are the enforced ones: at the limit is fine,
	// one past it is refused.
	cq, err := p.dev.CreateCQ(a.MaxCQE)
	require.NoError(t, err)
	_, err = p.dev.CreateCQ(a.MaxCQE + 1)
	require.ErrorIs(t, err, ib.ErrCQSize)
	for _, c := range []ib.QPCap{
		{MaxSendWR: uint32(a.MaxQPWR) + 1}, {MaxRecvWR: uint32(a.MaxQPWR) + 1},
		{MaxSendSGE: uint32(a.MaxSGE) + 1}, {MaxRecvSGE: uint32(a.MaxSGE) + 1},
		{MaxInlineData: uint32(a.MaxInlineData) + 1},
	} {
		_, err := p.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, Cap: c})
		require.Error(t, err, "%+v", c)
	}
	q, err := p.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, Cap: ib.QPCap{MaxSendWR: uint32(a.MaxQPWR),
		MaxRecvWR: uint32(a.MaxQPWR), MaxSendSGE: uint32(a.MaxSGE), MaxRecvSGE: uint32(a.MaxSGE), MaxInlineData: uint32(a.MaxInlineData)}})
	require.NoError(t, err)
	require.NoError(t, q.Destroy())
	_, err = p.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: a.MaxSRQWR + 1, MaxSGE: 1})
	require.Error(t, err)
	_, err = p.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 1, MaxSGE: a.MaxSRQSGE + 1})
	require.Error(t, err)
	srq, err := p.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: a.MaxSRQWR, MaxSGE: a.MaxSRQSGE})
	require.NoError(t, err)
	require.NoError(t, srq.Destroy())
}

// The GID table is the configured addresses in order, IPv4 ones in their
// IPv4-mapped form, as rdma_rxe derives GIDs from interface addresses.
func TestGIDTable(t *testing.T) {
	net := transport.NewMemNetwork()
	v4, v6 := netip.MustParseAddr("10.8.1.1"), netip.MustParseAddr("fd08::1")
	conn, err := net.Listen(netip.AddrPortFrom(v4, transport.RoCEv2Port))
	require.NoError(t, err)
	dev, err := ib.OpenDevice(ib.Config{Conn: conn, Addrs: []netip.Addr{v4, v6}, Workers: 1})
	require.NoError(t, err)
	defer dev.Close()
	require.Equal(t, []netip.Addr{netip.MustParseAddr("::ffff:10.8.1.1"), v6}, dev.GIDs())
	for i, want := range dev.GIDs() {
		g, err := dev.QueryGID(1, i)
		require.NoError(t, err)
		require.Equal(t, want, g)
	}
	for _, c := range []struct {
		port  uint8
		index int
	}{{1, 2}, {1, -1}, {2, 0}, {0, 0}} {
		_, err := dev.QueryGID(c.port, c.index)
		require.Error(t, err, "port %d index %d", c.port, c.index)
	}
	require.Equal(t, 0, dev.GIDIndex(v4))
	require.Equal(t, 0, dev.GIDIndex(netip.MustParseAddr("::ffff:10.8.1.1")), "mapped or not, the same GID")
	require.Equal(t, 1, dev.GIDIndex(v6))
	require.Equal(t, -1, dev.GIDIndex(netip.MustParseAddr("10.8.1.2")))

	// An address handle's source GID picks the family of its destination.
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	for _, c := range []struct {
		sgid int
		dst  string
		ok   bool
	}{{0, "10.8.1.9", true}, {1, "fd08::9", true}, {0, "fd08::9", false}, {1, "10.8.1.9", false}, {1, "::ffff:10.8.1.9", false}} {
		ah, err := pd.CreateAH(ib.AHAttr{DGID: netip.MustParseAddr(c.dst), SGIDIndex: uint8(c.sgid), PortNum: 1})
		if c.ok {
			require.NoError(t, err, "%+v", c)
			require.Equal(t, netip.MustParseAddr(c.dst), ah.AV().DGID)
			require.NoError(t, ah.Destroy())
		} else {
			require.Error(t, err, "%+v", c)
		}
	}
}

// Every QP state transition through the verbs API, per QP type: the
// valid ones with their required attributes succeed (and leave the QP in
// the new state), each required attribute left out is named in the
// error, and invalid transitions are refused without a state change.
func TestModifyEveryTransition(t *testing.T) {
	net := transport.NewMemNetwork()
	p := openPeer(net, "10.8.2.1")
	defer p.close()
	cq, err := p.dev.CreateCQ(1024)
	require.NoError(t, err)

	full := func(typ ib.QPType) *ib.QPAttr {
		return &ib.QPAttr{PortNum: 1, QKey: 0x1234, AccessFlags: ib.AccessRemoteWrite,
			PathMTU: ib.MTU2048, DestQPN: 0x99, RQPSN: 11, SQPSN: 22, MaxDestRdAtomic: 2, MaxRdAtomic: 3,
			MinRNRTimer: 12, Timeout: 14, RetryCnt: 6, RNRRetry: 5,
			AV: ib.AddrVector{DGID: netip.MustParseAddr("10.8.2.2"), PortNum: 1}}
	}
	type key struct {
		typ      ib.QPType
		from, to ib.QPState
	}
	rc := map[ib.QPType]bool{ib.RC: true}
	// required attributes of each valid transition (the IBA / kernel
	// qp_state_table for RC, UC and UD)
	required := func(k key) (ib.QPAttrMask, bool) {
		switch {
		case k.to == ib.QPSReset || k.to == ib.QPSErr:
			return 0, true
		case k.from == ib.QPSReset && k.to == ib.QPSInit:
			if k.typ == ib.UD {
				return ib.AttrPKeyIndex | ib.AttrPort | ib.AttrQKey, true
			}
			return ib.AttrPKeyIndex | ib.AttrPort | ib.AttrAccessFlags, true
		case k.from == ib.QPSInit && k.to == ib.QPSInit:
			return 0, true
		case k.from == ib.QPSInit && k.to == ib.QPSRTR:
			switch {
			case rc[k.typ]:
				return ib.AttrAV | ib.AttrPathMTU | ib.AttrDestQPN | ib.AttrRQPSN | ib.AttrMaxDestRdAtomic | ib.AttrMinRNRTimer, true
			case k.typ == ib.UC:
				return ib.AttrAV | ib.AttrPathMTU | ib.AttrDestQPN | ib.AttrRQPSN, true
			}
			return 0, true
		case k.from == ib.QPSRTR && k.to == ib.QPSRTS:
			if rc[k.typ] {
				return ib.AttrSQPSN | ib.AttrTimeout | ib.AttrRetryCnt | ib.AttrRNRRetry | ib.AttrMaxQPRdAtomic, true
			}
			return ib.AttrSQPSN, true
		case k.from == ib.QPSRTS && (k.to == ib.QPSRTS || k.to == ib.QPSSQD),
			k.from == ib.QPSSQD && (k.to == ib.QPSRTS || k.to == ib.QPSSQD):
			return 0, true
		}
		return 0, false
	}
	path := []ib.QPState{ib.QPSReset, ib.QPSInit, ib.QPSRTR, ib.QPSRTS, ib.QPSSQD}
	states := []ib.QPState{ib.QPSReset, ib.QPSInit, ib.QPSRTR, ib.QPSRTS, ib.QPSSQD, ib.QPSSQE, ib.QPSErr}
	// newQP creates a QP and drives it to from (RESET..SQD along the
	// path, ERR from INIT).
	newQP := func(t *testing.T, typ ib.QPType, from ib.QPState) *ib.QP {
		q, err := p.pd.CreateQP(ib.QPInitAttr{Type: typ, SendCQ: cq, RecvCQ: cq, Cap: ib.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
		require.NoError(t, err)
		t.Cleanup(func() { q.Destroy() })
		if from == ib.QPSErr {
			require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSErr}, ib.AttrState))
			return q
		}
		for i := 1; i < len(path) && path[i-1] != from; i++ {
			m, _ := required(key{typ, path[i-1], path[i]})
			a := full(typ)
			a.State = path[i]
			require.NoError(t, q.Modify(a, ib.AttrState|m), "%v: %v->%v", typ, path[i-1], path[i])
		}
		require.Equal(t, from, q.State())
		return q
	}
	for _, typ := range []ib.QPType{ib.RC, ib.UC, ib.UD} {
		for _, from := range append(path, ib.QPSErr) {
			for _, to := range states {
				k := key{typ, from, to}
				t.Run(fmt.Sprintf("%v/%v->%v", typ, from, to), func(t *testing.T) {
					a := full(typ)
					a.State = to
					req, valid := required(k)
					if !valid {
						q := newQP(t, typ, from)
						err := q.Modify(a, ib.AttrState|req)
						require.ErrorIs(t, err, ib.ErrInvalidTransition)
						require.Equal(t, from, q.State())
						return
					}
					for bit := ib.QPAttrMask(1); bit != 0 && bit <= req; bit <<= 1 {
						if req&bit == 0 {
							continue
						}
						q := newQP(t, typ, from)
						err := q.Modify(a, ib.AttrState|req&^bit)
						require.ErrorIs(t, err, ib.ErrMissingAttr, "without %v", bit)
						require.Contains(t, err.Error(), bit.String())
						require.Equal(t, from, q.State())
					}
					q := newQP(t, typ, from)
					require.NoError(t, q.Modify(a, ib.AttrState|req))
					require.Equal(t, to, q.State())
					got, _, err := q.Query()
					require.NoError(t, err)
					require.Equal(t, to, got.State)
				})
			}
		}
	}
}

// Query returns what Modify set, and the creation attributes.
func TestQueryReturnsModifiedAttributes(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectRC(a, qa, b, qb) // PSN 100 both ways
	connectRC(b, qb, a, qa)
	attr, init, err := qa.Query()
	require.NoError(t, err)
	require.Equal(t, ib.QPSRTS, attr.State)
	require.Equal(t, ib.MTU1024, attr.PathMTU)
	require.Equal(t, qb.Num(), attr.DestQPN)
	require.Equal(t, ib.PSN(100), attr.RQPSN)
	require.Equal(t, ib.PSN(100), attr.SQPSN)
	require.Equal(t, uint8(14), attr.Timeout)
	require.Equal(t, uint8(7), attr.RetryCnt)
	require.Equal(t, uint8(7), attr.RNRRetry)
	require.Equal(t, uint8(4), attr.MaxRdAtomic)
	require.Equal(t, uint8(4), attr.MaxDestRdAtomic)
	require.Equal(t, uint8(1), attr.MinRNRTimer)
	require.Equal(t, ib.AccessRemoteWrite|ib.AccessRemoteRead|ib.AccessRemoteAtomic, attr.AccessFlags)
	require.Equal(t, b.addr, attr.AV.DGID)
	require.Equal(t, uint32(16), attr.Cap.MaxSendWR)
	require.Equal(t, ib.RC, init.Type)
	require.Equal(t, a.cq, init.SendCQ)
	require.Equal(t, uint32(64), init.Cap.MaxInlineData)
	require.Equal(t, ib.RC, qa.Type())
	require.Equal(t, a.pd, qa.PD())
	require.Equal(t, a.dev, qa.PD().Device())
}

// Only signalled WRs complete, unless the QP signals all; an error
// always completes.
func TestSignalledAndUnsignalled(t *testing.T) {
	for _, sigAll := range []bool{false, true} {
		t.Run(fmt.Sprint("sigAll=", sigAll), func(t *testing.T) {
			net := transport.NewMemNetwork()
			a, b := openPeer(net, "10.8.3.1"), openPeer(net, "10.8.3.2")
			defer a.close()
			defer b.close()
			qa, err := a.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: a.cq, RecvCQ: a.cq, SigAll: sigAll,
				Cap: ib.QPCap{MaxSendWR: 16, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
			require.NoError(t, err)
			qb := b.createQP(ib.RC)
			connectBoth(a, qa, b, qb)
			var wrs []ib.SendWR
			for i := range 5 {
				wr := ib.SendWR{ID: uint64(i), Opcode: ib.WRRDMAWrite, SGL: []ib.SGE{a.sge(0, 8)},
					RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}
				if i == 4 {
					wr.Flags = ib.SendSignaled
				}
				wrs = append(wrs, wr)
			}
			require.NoError(t, qa.PostSend(wrs...))
			var ids []uint64
			for {
				wc := next(a.cq)
				require.Equal(t, ib.WCSuccess.String(), wc.Status.String())
				ids = append(ids, wc.ID)
				if wc.ID == 4 {
					break
				}
			}
			if sigAll {
				require.Equal(t, []uint64{0, 1, 2, 3, 4}, ids)
			} else {
				require.Equal(t, []uint64{4}, ids)
			}
			// An unsignalled WR that fails completes anyway.
			require.NoError(t, qa.PostSend(ib.SendWR{ID: 9, Opcode: ib.WRRDMAWrite, SGL: []ib.SGE{a.sge(0, 8)},
				RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey() ^ 1}))
			wc := next(a.cq)
			require.Equal(t, uint64(9), wc.ID)
			require.Equal(t, ib.WCRemAccessErr.String(), wc.Status.String())
			require.Equal(t, 0, a.cq.Len())
		})
	}
}

// A solicited-only arm fires for a solicited message, not for an
// ordinary one; an arm for any completion fires for the next one.
func TestCQSolicitedNotification(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	send := func(id uint64, flags ib.SendFlags) ib.WC {
		require.NoError(t, qb.PostRecv(ib.RecvWR{ID: id, SGL: []ib.SGE{b.sge(0, 64)}}))
		require.NoError(t, qa.PostSend(ib.SendWR{ID: id, Opcode: ib.WRSend, Flags: ib.SendInline | ib.SendSignaled | flags, Inline: []byte{1}}))
		next(a.cq)
		return next(b.cq)
	}
	require.NoError(t, b.cq.ReqNotify(true))
	send(1, 0)
	require.Equal(t, uint64(0), b.cq.Notifications(), "an unsolicited message does not fire a solicited-only arm")
	wc := send(2, ib.SendSolicited)
	require.True(t, wc.Solicited)
	require.Equal(t, uint64(1), b.cq.Notifications())
	<-b.cq.Notify()
	send(3, 0)
	require.Equal(t, uint64(1), b.cq.Notifications(), "a fired arm is spent")
	require.NoError(t, b.cq.ReqNotify(false))
	send(4, 0)
	require.Equal(t, uint64(2), b.cq.Notifications())
	select {
	case <-b.cq.Notify():
	default:
		t.Fatal("no notification on the channel")
	}
}

// A CQ too small for its completions overflows: the CQ_ERR event is
// raised and the overflow is sticky.
func TestCQOverflowRaisesCQErr(t *testing.T) {
	net := transport.NewMemNetwork()
	a, b := openPeer(net, "10.8.4.1"), openPeer(net, "10.8.4.2")
	defer a.close()
	defer b.close()
	require.Equal(t, ib.EventPortActive, (<-a.dev.Events()).Type)
	small, err := a.dev.CreateCQ(2)
	require.NoError(t, err)
	qa, err := a.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: small, RecvCQ: a.cq,
		Cap: ib.QPCap{MaxSendWR: 8, MaxSendSGE: 1, MaxRecvWR: 1}})
	require.NoError(t, err)
	qb := b.createQP(ib.RC)
	connectBoth(a, qa, b, qb)
	for i := range 3 {
		require.NoError(t, qa.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
			SGL: []ib.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}))
	}
	select {
	case ev := <-a.dev.Events():
		require.Equal(t, ib.EventCQErr, ev.Type)
		require.Equal(t, small, ev.CQ)
	case <-time.After(20 * time.Second):
		t.Fatal("no CQ_ERR event")
	}
	require.True(t, small.Overflowed())
	require.Equal(t, 2, small.Len())
}

// WaitPoll blocks until a completion arrives, and gives up with the
// context's error or when the CQ is destroyed.
func TestCQBlockingWait(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	done := make(chan ib.WC)
	go func() {
		var wc [1]ib.WC
		_, err := b.cq.WaitPoll(context.Background(), wc[:])
		if err != nil {
			panic(err)
		}
		done <- wc[0]
	}()
	require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 5, SGL: []ib.SGE{b.sge(0, 8)}}))
	require.NoError(t, qa.PostSend(ib.SendWR{Opcode: ib.WRSend, Flags: ib.SendInline, Inline: []byte("x")}))
	require.Equal(t, uint64(5), (<-done).ID)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var wc [1]ib.WC
	_, err := b.cq.WaitPoll(ctx, wc[:])
	require.ErrorIs(t, err, context.Canceled)
	_, err = b.cq.WaitPoll(context.Background(), nil)
	require.Error(t, err, "no room for a completion")

	lone, err := b.dev.CreateCQ(1)
	require.NoError(t, err)
	errc := make(chan error)
	go func() {
		_, err := lone.WaitPoll(context.Background(), wc[:0:0])
		errc <- err
	}()
	require.Error(t, <-errc)
	go func() { errc <- lone.Wait(context.Background()) }()
	require.NoError(t, lone.Destroy())
	require.Error(t, <-errc, "destroying the CQ wakes its waiters")
}

// Gather lists on the sender and scatter lists on the receiver: SEND and
// RDMA WRITE with immediate (which consumes a receive and reports the
// written length) place the bytes in list order.
func TestSGEListsAndWriteWithImm(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	copy(a.buf, "0123456789abcdef")
	gather := []ib.SGE{a.sge(0, 4), a.sge(8, 4)} // "0123" "89ab"

	require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{b.sge(100, 3), b.sge(200, 8)}}))
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: gather}))
	requireWC(t, a, 2, ib.WCSuccess)
	rwc := requireWC(t, b, 1, ib.WCSuccess)
	require.Equal(t, uint32(8), rwc.ByteLen)
	require.Equal(t, "012", string(b.buf[100:103]))
	require.Equal(t, "389ab\x00", string(b.buf[200:206]))

	require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 3}))
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 4, Opcode: ib.WRRDMAWriteWithImm, Flags: ib.SendSignaled, Imm: 0xABCD,
		SGL: gather, RemoteAddr: b.mr.IOVA() + 300, RKey: b.mr.RKey()}))
	requireWC(t, a, 4, ib.WCSuccess)
	rwc = requireWC(t, b, 3, ib.WCSuccess)
	require.Equal(t, ib.WCRecvRDMAWithImm.String(), rwc.Opcode.String())
	require.Equal(t, uint32(0xABCD), rwc.Imm)
	require.NotZero(t, rwc.Flags&ib.WCWithImm)
	require.Equal(t, uint32(8), rwc.ByteLen)
	require.Equal(t, "012389ab", string(b.buf[300:308]))

	// A receive too small for the message: LOC_LEN_ERR at the receiver.
	require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 5, SGL: []ib.SGE{b.sge(400, 4)}}))
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 6, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: gather}))
	requireWC(t, b, 5, ib.WCLocLenErr)
	wc := next(a.cq)
	require.Equal(t, uint64(6), wc.ID)
	require.Equal(t, ib.WCRemInvReqErr.String(), wc.Status.String(), "the sender learns of it by a NAK")
}

// Work requests in the non-running states: a send posted while the send
// queue is drained (SQD) waits for RTS; in ERR both queues complete
// everything with WR_FLUSH_ERR; RESET empties the queues silently.
func TestQueueSemanticsByState(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{b.sge(0, 64)}}))

	require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSSQD}, ib.AttrState))
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRSend, Flags: ib.SendSignaled | ib.SendInline, Inline: []byte("sqd")}))
	require.Equal(t, 0, b.cq.Len(), "nothing starts in SQD")
	require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSRTS}, ib.AttrState))
	requireWC(t, a, 2, ib.WCSuccess)
	requireWC(t, b, 1, ib.WCSuccess)

	// ERR: posted receives and sends are flushed, in order.
	require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 3, SGL: []ib.SGE{b.sge(0, 64)}}, ib.RecvWR{ID: 4}))
	require.NoError(t, qb.Modify(&ib.QPAttr{State: ib.QPSErr}, ib.AttrState))
	requireWC(t, b, 3, ib.WCWRFlushErr)
	requireWC(t, b, 4, ib.WCWRFlushErr)
	require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 5}))
	requireWC(t, b, 5, ib.WCWRFlushErr)
	require.NoError(t, qb.PostSend(ib.SendWR{ID: 6, Opcode: ib.WRSend, Flags: ib.SendInline, Inline: []byte("x")}))
	wc := requireWC(t, b, 6, ib.WCWRFlushErr)
	require.Equal(t, qb.Num(), wc.QPNum)

	// RESET: a receive posted before it is gone afterwards, silently.
	require.NoError(t, qb.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
	require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
	require.NoError(t, qb.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, AccessFlags: ib.AccessRemoteWrite},
		ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags))
	require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 7, SGL: []ib.SGE{b.sge(0, 64)}}))
	require.NoError(t, qb.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
	require.Equal(t, 0, b.cq.Len(), "RESET generates no completions")
	connectBoth(a, qa, b, qb)
	requireWorks(t, a, qa, b, qb) // its receive (4242) is the first one consumed
}

// Local key checks, with rdma_rxe's statuses: a bad local SGE fails the
// requester with LOC_PROT_ERR (the responder is not involved); a receive
// buffer that cannot be written fails the receiver with LOC_QP_OP_ERR
// (rxe's malformed-WQE class) and the sender with REM_OP_ERR.
func TestLocalProtection(t *testing.T) {
	cases := []struct {
		name         string
		wr           func(a, b *peer, noLW *ib.MR) ib.SendWR
		recv         func(b *peer, noLW *ib.MR) []ib.SGE // nil: the usual receive
		send, remote ib.WCStatus
	}{
		{"READ into a region without LOCAL_WRITE", func(a, b *peer, noLW *ib.MR) ib.SendWR {
			return ib.SendWR{Opcode: ib.WRRDMARead, SGL: []ib.SGE{{Addr: noLW.IOVA(), Length: 8, LKey: noLW.LKey()}},
				RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}
		}, nil, ib.WCLocProtErr, -1},
		{"SEND with a stale lkey", func(a, b *peer, noLW *ib.MR) ib.SendWR {
			return ib.SendWR{Opcode: ib.WRSend, SGL: []ib.SGE{{Addr: a.mr.IOVA(), Length: 8, LKey: ib.IncRKey(a.mr.LKey())}}}
		}, nil, ib.WCLocProtErr, -1},
		{"SEND from past the region's end", func(a, b *peer, noLW *ib.MR) ib.SendWR {
			return ib.SendWR{Opcode: ib.WRSend, SGL: []ib.SGE{{Addr: a.mr.IOVA() + uint64(len(a.buf)) - 4, Length: 8, LKey: a.mr.LKey()}}}
		}, nil, ib.WCLocProtErr, -1},
		{"SEND from a region without LOCAL_WRITE (reading is allowed)", func(a, b *peer, noLW *ib.MR) ib.SendWR {
			return ib.SendWR{Opcode: ib.WRSend, SGL: []ib.SGE{{Addr: noLW.IOVA(), Length: 8, LKey: noLW.LKey()}}}
		}, nil, ib.WCSuccess, ib.WCSuccess},
		{"SEND into a receive without LOCAL_WRITE", func(a, b *peer, noLW *ib.MR) ib.SendWR {
			return ib.SendWR{Opcode: ib.WRSend, Flags: ib.SendInline, Inline: []byte("x")}
		}, func(b *peer, noLW *ib.MR) []ib.SGE {
			return []ib.SGE{{Addr: noLW.IOVA(), Length: 8, LKey: noLW.LKey()}}
		}, ib.WCRemOpErr, ib.WCLocQPOpErr},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, qa, b, qb := testPair(t)
			connectBoth(a, qa, b, qb)
			aNoLW, err := a.pd.RegMR(a.buf[32<<10:], ib.AccessRemoteRead)
			require.NoError(t, err)
			bNoLW, err := b.pd.RegMR(b.buf[32<<10:], ib.AccessRemoteRead)
			require.NoError(t, err)
			sgl := []ib.SGE{b.sge(0, 64)}
			if c.recv != nil {
				sgl = c.recv(b, bNoLW)
			}
			require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 1, SGL: sgl}))
			wr := c.wr(a, b, aNoLW)
			wr.ID, wr.Flags = 2, wr.Flags|ib.SendSignaled
			before := bytes.Clone(b.buf[:64])
			require.NoError(t, qa.PostSend(wr))
			requireWC(t, a, 2, c.send)
			if c.remote >= 0 {
				requireWC(t, b, 1, c.remote)
			}
			if c.send != ib.WCSuccess {
				require.Equal(t, ib.QPSErr, qa.State())
				require.Equal(t, before, b.buf[:64])
			}
			if c.remote < 0 {
				require.Equal(t, ib.QPSRTS, qb.State(), "a local error stays local")
				require.Equal(t, 0, b.cq.Len(), "the responder completed nothing")
			}
		})
	}
}
