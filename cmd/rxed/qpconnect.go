package main

import "github.com/rxed/rxed/pkg/ib"

// initQP moves qp to INIT on port 1: UD QPs get qkey, the others access
// (ib.Access bits).
func initQP(qp *ib.QP, typ ib.QPType, qkey uint32, access ib.Access) error {
	a := &ib.QPAttr{State: ib.QPSInit, PKeyIndex: 0, PortNum: 1}
	mask := ib.AttrState | ib.AttrPKeyIndex | ib.AttrPort
	if typ == ib.UD {
		a.QKey = qkey
		mask |= ib.AttrQKey
	} else {
		a.AccessFlags = access
		mask |= ib.AttrAccessFlags
	}
	return qp.Modify(a, mask)
}

// qpPath is what a QP needs to go from INIT to RTS against its peer.
type qpPath struct {
	av      ib.AddrVector
	mtu     ib.MTU
	destQPN uint32
	rqPSN   uint32 // the peer's first PSN
	sqPSN   uint32 // ours
	// RC only: the local ACK timeout exponent, the reads/atomics we accept
	// (max_dest_rd_atomic) and those we issue (max_rd_atomic).
	timeout       uint8
	maxDestRdAtom uint8
	maxRdAtomic   uint8
}

// connectQP moves qp to RTR and RTS with the attributes of rdma-core's
// pp_connect_ctx and perftest's ctx_connect: UD needs only the state
// changes and an address handle (returned), UC the path, RC also the
// retry and RDMA read/atomic settings.
func connectQP(pd *ib.PD, qp *ib.QP, typ ib.QPType, p qpPath) (*ib.AH, error) {
	rts := &ib.QPAttr{State: ib.QPSRTS, SQPSN: ib.PSN(p.sqPSN)}
	rtsMask := ib.AttrState | ib.AttrSQPSN
	if typ == ib.UD {
		if err := qp.Modify(&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState); err != nil {
			return nil, err
		}
		if err := qp.Modify(rts, rtsMask); err != nil {
			return nil, err
		}
		return pd.CreateAH(p.av)
	}
	rtr := &ib.QPAttr{State: ib.QPSRTR, PathMTU: p.mtu, DestQPN: p.destQPN, RQPSN: ib.PSN(p.rqPSN), AV: p.av}
	rtrMask := ib.AttrState | ib.AttrAV | ib.AttrPathMTU | ib.AttrDestQPN | ib.AttrRQPSN
	if typ == ib.RC {
		rtr.MaxDestRdAtomic, rtr.MinRNRTimer = p.maxDestRdAtom, 12
		rtrMask |= ib.AttrMaxDestRdAtomic | ib.AttrMinRNRTimer
		rts.Timeout, rts.RetryCnt, rts.RNRRetry, rts.MaxRdAtomic = p.timeout, 7, 7, p.maxRdAtomic
		rtsMask |= ib.AttrTimeout | ib.AttrRetryCnt | ib.AttrRNRRetry | ib.AttrMaxQPRdAtomic
	}
	if err := qp.Modify(rtr, rtrMask); err != nil {
		return nil, err
	}
	return nil, qp.Modify(rts, rtsMask)
}
