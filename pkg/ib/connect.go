package ib

import (
	"errors"
	"fmt"
	"net/netip"
)

// RemoteQP is what one end of a connection must learn about the other
// before its QP can talk to it: what ibv_rc_pingpong and perftest swap
// over TCP, and what the CM carries in REQ and REP.
type RemoteQP struct {
	QPN uint32     // the peer's QP number (dest_qp_num)
	PSN uint32     // the first PSN the peer sends (our rq_psn), 24 bits
	GID netip.Addr // the peer's GID: its IP address (IPv4 or IPv6)
	// UDPPort is the peer's RoCEv2 port; 0 means 4791, what every
	// rdma_rxe peer uses.
	UDPPort uint16
	// MTU is the path MTU; 0 means the smaller of 1024 and the port's
	// active MTU (what rdma_rxe has on an Ethernet link of 1500 bytes).
	MTU MTU
}

// ConnectAttr is our side's half of a connection (ConnectQP).
type ConnectAttr struct {
	// SGIDIndex is the GID (local address) the QP sends from; a negative
	// value picks the first GID of the peer's address family.
	SGIDIndex int
	// PSN is the first PSN we send (sq_psn), 24 bits.
	PSN uint32
	// AccessFlags are the remote operations the QP accepts (INIT's
	// qp_access_flags: AccessRemoteWrite, AccessRemoteRead,
	// AccessRemoteAtomic); UD ignores them.
	AccessFlags Access
	// QKey is a UD QP's Q_Key.
	QKey uint32
	// RC only: Timeout is the local ACK timeout exponent (4.096 us x
	// 2^Timeout; 0 means infinite, as in IBA), RetryCnt and RNRRetry the
	// retry counts (7 RNR retries mean infinite), MinRNRTimer the RNR NAK
	// timer code we send.
	Timeout, RetryCnt, RNRRetry, MinRNRTimer uint8
	// MaxRdAtomic is how many READs/atomics we may have outstanding (RC).
	MaxRdAtomic uint8
	// MaxDestRdAtomic is how many READs/atomics we accept at once (RC).
	MaxDestRdAtomic uint8
	// HopLimit and TrafficClass of the path; 0 hop limit means 64.
	HopLimit, TrafficClass uint8
	// FlowLabel is the path's IPv6 flow label.
	FlowLabel uint32
}

// ConnectQP moves q from RESET (or INIT) through INIT (InitQP) and RTR to RTS
// against the peer r, the sequence every out-of-band exchange ends with
// (rdma-core's pp_connect_ctx, perftest's ctx_connect): INIT with port 1,
// P_Key index 0 and a's access flags (UD: its Q_Key); RTR with the path,
// MTU, the peer's QPN and PSN; RTS with our PSN. UD QPs get only the
// state changes (their peers are named per WR by an address handle).
// A connection manager derives the same attributes from REQ and REP
// (pkg/rdmacm).
func ConnectQP(q *QP, r RemoteQP, a ConnectAttr) error {
	if q == nil {
		return errors.New("ib: ConnectQP: nil QP")
	}
	d := q.pd.d
	if err := InitQP(q, a); err != nil {
		return fmt.Errorf("ib: ConnectQP: %w", err)
	}
	if q.Type() == UD {
		if err := q.Modify(&QPAttr{State: QPSRTR}, AttrState); err != nil {
			return fmt.Errorf("ib: ConnectQP: to RTR: %w", err)
		}
		if err := q.Modify(&QPAttr{State: QPSRTS, SQPSN: PSN(a.PSN)}, AttrState|AttrSQPSN); err != nil {
			return fmt.Errorf("ib: ConnectQP: to RTS: %w", err)
		}
		return nil
	}
	if !r.GID.IsValid() {
		return errors.New("ib: ConnectQP: the peer's GID is required")
	}
	sgid := a.SGIDIndex
	if sgid < 0 {
		sgid = firstGIDOfFamily(d.GIDs(), r.GID)
		if sgid < 0 {
			return fmt.Errorf("ib: ConnectQP: no local GID of the family of %v", r.GID)
		}
	}
	mtu := r.MTU
	if mtu == 0 {
		mtu = min(MTU1024, d.mtu)
	}
	port := r.UDPPort
	av := AddrVector{DGID: r.GID, SGIDIndex: uint8(sgid), HopLimit: a.HopLimit, TrafficClass: a.TrafficClass,
		FlowLabel: a.FlowLabel, PortNum: 1, DestPort: port}
	rtr := &QPAttr{State: QPSRTR, PathMTU: mtu, DestQPN: r.QPN, RQPSN: PSN(r.PSN), AV: av}
	rtrMask := AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN
	rts := &QPAttr{State: QPSRTS, SQPSN: PSN(a.PSN)}
	rtsMask := AttrState | AttrSQPSN
	if q.Type() == RC {
		rtr.MaxDestRdAtomic, rtr.MinRNRTimer = a.MaxDestRdAtomic, a.MinRNRTimer
		rtrMask |= AttrMaxDestRdAtomic | AttrMinRNRTimer
		rts.Timeout, rts.RetryCnt, rts.RNRRetry, rts.MaxRdAtomic = a.Timeout, a.RetryCnt, a.RNRRetry, a.MaxRdAtomic
		rtsMask |= AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic
	}
	if err := q.Modify(rtr, rtrMask); err != nil {
		return fmt.Errorf("ib: ConnectQP: to RTR: %w", err)
	}
	if err := q.Modify(rts, rtsMask); err != nil {
		return fmt.Errorf("ib: ConnectQP: to RTS: %w", err)
	}
	return nil
}

// InitQP moves q from RESET to INIT on port 1 with P_Key index 0 and a's
// access flags (UD: its Q_Key), the state rdma_create_qp leaves a QP in
// and the one a QP needs before receives can be posted. A QP already in
// INIT is modified INIT -> INIT with those attributes (IBA allows it;
// posted receives stay). Other states are an error.
func InitQP(q *QP, a ConnectAttr) error {
	if q == nil {
		return errors.New("ib: InitQP: nil QP")
	}
	init := &QPAttr{State: QPSInit, PKeyIndex: 0, PortNum: 1}
	mask := AttrState | AttrPKeyIndex | AttrPort
	switch q.Type() {
	case UD, GSI:
		init.QKey = a.QKey
		mask |= AttrQKey
	default:
		init.AccessFlags = a.AccessFlags
		mask |= AttrAccessFlags
	}
	switch st := q.State(); st {
	case QPSReset:
	case QPSInit:
		mask &^= AttrPort | AttrPKeyIndex
	default:
		return fmt.Errorf("ib: InitQP: QP %#x is in %v", q.Num(), st)
	}
	if err := q.Modify(init, mask); err != nil {
		return fmt.Errorf("to INIT: %w", err)
	}
	return nil
}

// firstGIDOfFamily returns the index of the first GID of peer's address
// family, or -1.
func firstGIDOfFamily(gids []netip.Addr, peer netip.Addr) int {
	v4 := peer.Unmap().Is4()
	for i, g := range gids {
		if g.Unmap().Is4() == v4 {
			return i
		}
	}
	return -1
}
