package ib

import (
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce"
)

// The General Services Interface QP (QP1).
//
// Management datagrams (MADs) of the general service classes, the
// communication manager's among them, travel between the QP1s of two
// ports: UD SEND_ONLY packets to destination QP 1 whose DETH carries the
// well-known Q_Key 0x80010000 and source QP 1, under the default P_Key
// 0xFFFF. A device has at most one GSI QP at a time:
//
//	gsi, err := pd.CreateQP(ib.QPInitAttr{Type: ib.GSI, SendCQ: cq, RecvCQ: cq, Cap: ...})
//
// creates it as QP number 1 (a second one fails with ErrQPNInUse; QP0,
// the subnet management QP, never exists on RoCE and packets for it are
// dropped as drop_qp). It behaves as UD: every send WR carries its
// destination (an AV to the peer's GID, RemoteQPN 1, RemoteQKey GSIQKey),
// and a receive completion carries SrcQP and, in the buffer's first 40
// bytes, the GRH rebuilt from the IP header (for IPv4: 20 zero bytes,
// then the IPv4 header). Its Q_Key is fixed to GSIQKey and its P_Key
// index to 0: Modify accepts IBV_QP_QKEY and IBV_QP_PKEY_INDEX (INIT
// requires them, as for any GSI QP) and ignores their values, as rxe
// checks and sends QP1's packets with GSI_QKEY whatever qkey was set.
// Query reports GSIQKey, the Q_Key QP1 uses; rxe's query reports the
// value set (docs/DESIGN.md says why rxed does not).
// Its SENDs carry GSIQKey whatever RemoteQKey the WR names, as rxe's
// (init_req_packet): a GSI peer drops any other Q_Key.
//
// Receive checks follow rxe's check_keys for QP1: the BTH P_Key must
// match the default P_Key (0xFFFF or 0x7FFF) and the DETH Q_Key must be
// GSIQKey; other packets are dropped and counted as drop_pkey and
// drop_qkey, which QueryPort reports as the port's bad_pkey_cntr and
// qkey_viol_cntr, where rxe counts them.
//
// Most programs do not use the QP directly but through a MADAgent
// (mad.go), which owns it, keeps receives posted and recycles send
// buffers.
const (
	// GSI is the QP type of QP1 (IB_QPT_GSI).
	GSI = qp.GSI
	// GSIQPN is the GSI QP's number.
	GSIQPN = roce.GSIQPN
	// GSIQKey is QP1's well-known Q_Key (IB_QP1_QKEY).
	GSIQKey = qp.GSIQKey
	// DefaultPKey is the only partition key (IB_DEFAULT_PKEY_FULL).
	DefaultPKey = qp.DefaultPKey
)

// ErrQPNInUse: CreateQP of a GSI QP on a device that has one.
var ErrQPNInUse = roce.ErrQPNInUse
