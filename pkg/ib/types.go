package ib

import (
	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
)

// The verbs value types are those of pkg/qp and pkg/mr, re-exported here
// under their libibverbs names so that a program needs only this package.

type (
	// QPType is enum ibv_qp_type: RC, UC, UD.
	QPType = qp.Type
	// QPState is enum ibv_qp_state.
	QPState = qp.State
	// MTU is enum ibv_mtu (MTU256 … MTU4096).
	MTU = qp.MTU
	// PSN is a 24-bit packet sequence number.
	PSN = qp.PSN
	// QPAttr is struct ibv_qp_attr.
	QPAttr = qp.Attr
	// QPAttrMask is enum ibv_qp_attr_mask.
	QPAttrMask = qp.AttrMask
	// QPCap is struct ibv_qp_cap.
	QPCap = qp.Cap
	// AddrVector is struct ibv_ah_attr with its GRH; on RoCEv2 the GIDs are
	// IP addresses.
	AddrVector = qp.AddrVector
	// SGE is struct ibv_sge.
	SGE = qp.SGE
	// SendWR is struct ibv_send_wr (post a slice instead of a list).
	SendWR = qp.SendWR
	// RecvWR is struct ibv_recv_wr.
	RecvWR = qp.RecvWR
	// WROpcode is enum ibv_wr_opcode.
	WROpcode = qp.WROpcode
	// SendFlags is enum ibv_send_flags.
	SendFlags = qp.SendFlags
	// WC is struct ibv_wc.
	WC = qp.WC
	// WCStatus is enum ibv_wc_status; String gives libibverbs' names.
	WCStatus = qp.WCStatus
	// WCOpcode is enum ibv_wc_opcode.
	WCOpcode = qp.WCOpcode
	// WCFlags is enum ibv_wc_flags.
	WCFlags = qp.WCFlags
	// Access is enum ibv_access_flags.
	Access = mr.Access
	// RegOption modifies RegMR (WithIOVA, like ibv_reg_mr_iova).
	RegOption = mr.RegOption
	// MWType is enum ibv_mw_type.
	MWType = mr.MWType
	// MWBindInfo describes a BIND_MW work request.
	MWBindInfo = qp.MWBindInfo
)

// QP types.
const (
	RC = qp.RC // IBV_QPT_RC
	UC = qp.UC // IBV_QPT_UC
	UD = qp.UD // IBV_QPT_UD
)

// QP states.
const (
	QPSReset = qp.Reset // IBV_QPS_RESET
	QPSInit  = qp.Init  // IBV_QPS_INIT
	QPSRTR   = qp.RTR   // IBV_QPS_RTR
	QPSRTS   = qp.RTS   // IBV_QPS_RTS
	QPSSQD   = qp.SQD   // IBV_QPS_SQD
	QPSSQE   = qp.SQE   // IBV_QPS_SQE
	QPSErr   = qp.Err   // IBV_QPS_ERR
)

// Path MTUs.
const (
	MTU256  = qp.MTU256
	MTU512  = qp.MTU512
	MTU1024 = qp.MTU1024
	MTU2048 = qp.MTU2048
	MTU4096 = qp.MTU4096
)

// QP attribute mask bits (IBV_QP_*).
const (
	AttrState            = qp.AttrState
	AttrCurState         = qp.AttrCurState
	AttrEnSQDAsyncNotify = qp.AttrEnSQDAsyncNotify
	AttrAccessFlags      = qp.AttrAccessFlags
	AttrPKeyIndex        = qp.AttrPKeyIndex
	AttrPort             = qp.AttrPort
	AttrQKey             = qp.AttrQKey
	AttrAV               = qp.AttrAV
	AttrPathMTU          = qp.AttrPathMTU
	AttrTimeout          = qp.AttrTimeout
	AttrRetryCnt         = qp.AttrRetryCnt
	AttrRNRRetry         = qp.AttrRNRRetry
	AttrRQPSN            = qp.AttrRQPSN
	AttrMaxQPRdAtomic    = qp.AttrMaxQPRdAtomic
	AttrMinRNRTimer      = qp.AttrMinRNRTimer
	AttrSQPSN            = qp.AttrSQPSN
	AttrMaxDestRdAtomic  = qp.AttrMaxDestRdAtomic
	AttrPathMigState     = qp.AttrPathMigState
	AttrCap              = qp.AttrCap
	AttrDestQPN          = qp.AttrDestQPN
)

// Access flags (IBV_ACCESS_*), one type for every place libibverbs takes
// them: a region's rights (PD.RegMR), a QP's qp_access_flags
// (QPAttr.AccessFlags, ConnectAttr.AccessFlags), a window bind's
// (MWBind.Access, MWBindInfo.Access) and a fast registration's
// (RegMRInfo.Access). A QP honours the remote bits (AccessRemoteWrite,
// AccessRemoteRead, AccessRemoteAtomic) and the FLUSH ones.
const (
	AccessLocalWrite      = mr.LocalWrite
	AccessRemoteWrite     = mr.RemoteWrite
	AccessRemoteRead      = mr.RemoteRead
	AccessRemoteAtomic    = mr.RemoteAtomic
	AccessMWBind          = mr.MWBind
	AccessZeroBased       = mr.ZeroBased
	AccessFlushGlobal     = mr.FlushGlobal
	AccessFlushPersistent = mr.FlushPersistent
)

// Work request opcodes (IBV_WR_*).
const (
	WRRDMAWrite         = qp.WRRDMAWrite
	WRRDMAWriteWithImm  = qp.WRRDMAWriteWithImm
	WRSend              = qp.WRSend
	WRSendWithImm       = qp.WRSendWithImm
	WRRDMARead          = qp.WRRDMARead
	WRAtomicCmpAndSwp   = qp.WRAtomicCmpAndSwp
	WRAtomicFetchAndAdd = qp.WRAtomicFetchAndAdd
	WRLocalInv          = qp.WRLocalInv
	WRBindMW            = qp.WRBindMW
	WRSendWithInv       = qp.WRSendWithInv
	WRFlush             = qp.WRFlush
	WRAtomicWrite       = qp.WRAtomicWrite
)

// Send flags (IBV_SEND_*).
const (
	SendFence     = qp.Fence
	SendSignaled  = qp.Signaled
	SendSolicited = qp.Solicited
	SendInline    = qp.Inline
)

// Completion statuses (IBV_WC_*).
const (
	WCSuccess        = qp.WCSuccess
	WCLocLenErr      = qp.WCLocLenErr
	WCLocQPOpErr     = qp.WCLocQPOpErr
	WCLocProtErr     = qp.WCLocProtErr
	WCWRFlushErr     = qp.WCWRFlushErr
	WCMWBindErr      = qp.WCMWBindErr
	WCBadRespErr     = qp.WCBadRespErr
	WCLocAccessErr   = qp.WCLocAccessErr
	WCRemInvReqErr   = qp.WCRemInvReqErr
	WCRemAccessErr   = qp.WCRemAccessErr
	WCRemOpErr       = qp.WCRemOpErr
	WCRetryExcErr    = qp.WCRetryExcErr
	WCRNRRetryExcErr = qp.WCRNRRetryExcErr
	WCFatalErr       = qp.WCFatalErr
	WCGeneralErr     = qp.WCGeneralErr
)

// Completion opcodes (IBV_WC_*).
const (
	WCSend            = qp.WCSend
	WCRDMAWrite       = qp.WCRDMAWrite
	WCRDMARead        = qp.WCRDMARead
	WCCompSwap        = qp.WCCompSwap
	WCFetchAdd        = qp.WCFetchAdd
	WCBindMW          = qp.WCBindMW
	WCLocalInv        = qp.WCLocalInv
	WCFlush           = qp.WCFlush
	WCAtomicWrite     = qp.WCAtomicWrite
	WCRecv            = qp.WCRecv
	WCRecvRDMAWithImm = qp.WCRecvRDMAWithImm
)

// Completion flags (IBV_WC_*).
const (
	WCWithGRH = qp.WCWithGRH
	WCWithImm = qp.WCWithImm
	WCWithInv = qp.WCWithInv
)

// Memory window types.
const (
	MWType1 = mr.MWType1
	MWType2 = mr.MWType2
)

// WithIOVA registers a region at an explicit I/O virtual address, like
// ibv_reg_mr_iova; by default a region's address is its buffer's address.
func WithIOVA(iova uint64) RegOption { return mr.WithIOVA(iova) }
