package qp

import (
	"fmt"
	"strconv"
)

// WCStatus is a completion status with the enum ibv_wc_status values.
type WCStatus int

// Completion statuses.
const (
	WCSuccess          WCStatus = 0  // IBV_WC_SUCCESS
	WCLocLenErr        WCStatus = 1  // IBV_WC_LOC_LEN_ERR
	WCLocQPOpErr       WCStatus = 2  // IBV_WC_LOC_QP_OP_ERR
	WCLocEECOpErr      WCStatus = 3  // IBV_WC_LOC_EEC_OP_ERR
	WCLocProtErr       WCStatus = 4  // IBV_WC_LOC_PROT_ERR
	WCWRFlushErr       WCStatus = 5  // IBV_WC_WR_FLUSH_ERR
	WCMWBindErr        WCStatus = 6  // IBV_WC_MW_BIND_ERR
	WCBadRespErr       WCStatus = 7  // IBV_WC_BAD_RESP_ERR
	WCLocAccessErr     WCStatus = 8  // IBV_WC_LOC_ACCESS_ERR
	WCRemInvReqErr     WCStatus = 9  // IBV_WC_REM_INV_REQ_ERR
	WCRemAccessErr     WCStatus = 10 // IBV_WC_REM_ACCESS_ERR
	WCRemOpErr         WCStatus = 11 // IBV_WC_REM_OP_ERR
	WCRetryExcErr      WCStatus = 12 // IBV_WC_RETRY_EXC_ERR
	WCRNRRetryExcErr   WCStatus = 13 // IBV_WC_RNR_RETRY_EXC_ERR
	WCLocRDDViolErr    WCStatus = 14 // IBV_WC_LOC_RDD_VIOL_ERR
	WCRemInvRDReqErr   WCStatus = 15 // IBV_WC_REM_INV_RD_REQ_ERR
	WCRemAbortErr      WCStatus = 16 // IBV_WC_REM_ABORT_ERR
	WCInvEECNErr       WCStatus = 17 // IBV_WC_INV_EECN_ERR
	WCInvEECStateErr   WCStatus = 18 // IBV_WC_INV_EEC_STATE_ERR
	WCFatalErr         WCStatus = 19 // IBV_WC_FATAL_ERR
	WCRespTimeoutErr   WCStatus = 20 // IBV_WC_RESP_TIMEOUT_ERR
	WCGeneralErr       WCStatus = 21 // IBV_WC_GENERAL_ERR
	WCTMErr            WCStatus = 22 // IBV_WC_TM_ERR
	WCTMRndvIncomplete WCStatus = 23 // IBV_WC_TM_RNDV_INCOMPLETE
)

var wcStatusNames = [...]struct{ name, desc string }{
	WCSuccess:          {"SUCCESS", "success"},
	WCLocLenErr:        {"LOC_LEN_ERR", "local length error"},
	WCLocQPOpErr:       {"LOC_QP_OP_ERR", "local QP operation error"},
	WCLocEECOpErr:      {"LOC_EEC_OP_ERR", "local EE context operation error"},
	WCLocProtErr:       {"LOC_PROT_ERR", "local protection error"},
	WCWRFlushErr:       {"WR_FLUSH_ERR", "Work Request Flushed Error"},
	WCMWBindErr:        {"MW_BIND_ERR", "memory management operation error"},
	WCBadRespErr:       {"BAD_RESP_ERR", "bad response error"},
	WCLocAccessErr:     {"LOC_ACCESS_ERR", "local access error"},
	WCRemInvReqErr:     {"REM_INV_REQ_ERR", "remote invalid request error"},
	WCRemAccessErr:     {"REM_ACCESS_ERR", "remote access error"},
	WCRemOpErr:         {"REM_OP_ERR", "remote operation error"},
	WCRetryExcErr:      {"RETRY_EXC_ERR", "transport retry counter exceeded"},
	WCRNRRetryExcErr:   {"RNR_RETRY_EXC_ERR", "RNR retry counter exceeded"},
	WCLocRDDViolErr:    {"LOC_RDD_VIOL_ERR", "local RDD violation error"},
	WCRemInvRDReqErr:   {"REM_INV_RD_REQ_ERR", "remote invalid RD request"},
	WCRemAbortErr:      {"REM_ABORT_ERR", "aborted error"},
	WCInvEECNErr:       {"INV_EECN_ERR", "invalid EE context number"},
	WCInvEECStateErr:   {"INV_EEC_STATE_ERR", "invalid EE context state"},
	WCFatalErr:         {"FATAL_ERR", "fatal error"},
	WCRespTimeoutErr:   {"RESP_TIMEOUT_ERR", "response timeout error"},
	WCGeneralErr:       {"GENERAL_ERR", "general error"},
	WCTMErr:            {"TM_ERR", "TM error"},
	WCTMRndvIncomplete: {"TM_RNDV_INCOMPLETE", "TM software rendezvous"},
}

// String returns the libibverbs enumerator name without the IBV_WC_
// prefix, e.g. "WR_FLUSH_ERR".
func (s WCStatus) String() string {
	if s >= 0 && int(s) < len(wcStatusNames) {
		return wcStatusNames[s].name
	}
	return "WCStatus(" + strconv.Itoa(int(s)) + ")"
}

// Description returns the text ibv_wc_status_str gives, e.g.
// "transport retry counter exceeded".
func (s WCStatus) Description() string {
	if s >= 0 && int(s) < len(wcStatusNames) {
		return wcStatusNames[s].desc
	}
	return "unknown"
}

// Err returns nil for WCSuccess and otherwise an error naming the status,
// for code that treats a failed completion as an error. (WCStatus itself is
// not an error, so that printing a status prints its libibverbs name.)
func (s WCStatus) Err() error {
	if s == WCSuccess {
		return nil
	}
	return wcStatusError(s)
}

// wcStatusError is the error form of a failed WCStatus.
type wcStatusError WCStatus

func (e wcStatusError) Error() string {
	s := WCStatus(e)
	return fmt.Sprintf("work completion %s (%s)", s.String(), s.Description())
}

// WCOpcode is a completion opcode with the enum ibv_wc_opcode values
// (WCRegMR has the kernel's IB_WC_REG_MR value).
type WCOpcode int

// Completion opcodes. Receive completions have bit 7 set (WCRecv).
const (
	WCSend            WCOpcode = 0   // IBV_WC_SEND
	WCRDMAWrite       WCOpcode = 1   // IBV_WC_RDMA_WRITE
	WCRDMARead        WCOpcode = 2   // IBV_WC_RDMA_READ
	WCCompSwap        WCOpcode = 3   // IBV_WC_COMP_SWAP
	WCFetchAdd        WCOpcode = 4   // IBV_WC_FETCH_ADD
	WCBindMW          WCOpcode = 5   // IBV_WC_BIND_MW
	WCLocalInv        WCOpcode = 6   // IBV_WC_LOCAL_INV
	WCTSO             WCOpcode = 7   // IBV_WC_TSO
	WCFlush           WCOpcode = 8   // IBV_WC_FLUSH
	WCAtomicWrite     WCOpcode = 9   // IBV_WC_ATOMIC_WRITE
	WCRegMR           WCOpcode = 10  // IB_WC_REG_MR
	WCRecv            WCOpcode = 128 // IBV_WC_RECV
	WCRecvRDMAWithImm WCOpcode = 129 // IBV_WC_RECV_RDMA_WITH_IMM
)

var wcOpcodeNames = map[WCOpcode]string{
	WCSend:            "SEND",
	WCRDMAWrite:       "RDMA_WRITE",
	WCRDMARead:        "RDMA_READ",
	WCCompSwap:        "COMP_SWAP",
	WCFetchAdd:        "FETCH_ADD",
	WCBindMW:          "BIND_MW",
	WCLocalInv:        "LOCAL_INV",
	WCTSO:             "TSO",
	WCFlush:           "FLUSH",
	WCAtomicWrite:     "ATOMIC_WRITE",
	WCRegMR:           "REG_MR",
	WCRecv:            "RECV",
	WCRecvRDMAWithImm: "RECV_RDMA_WITH_IMM",
}

// String returns the libibverbs name without the IBV_WC_ prefix.
func (op WCOpcode) String() string {
	if s, ok := wcOpcodeNames[op]; ok {
		return s
	}
	return "WCOpcode(" + strconv.Itoa(int(op)) + ")"
}

// IsRecv reports whether op is a receive-side completion.
func (op WCOpcode) IsRecv() bool { return op&WCRecv != 0 }

// WCFlags describe a completion, with the enum ibv_wc_flags values.
type WCFlags uint32

// Completion flags.
const (
	WCWithGRH     WCFlags = 1 << 0 // IBV_WC_GRH: on every successful receive (recvWCFlags); UD's first 40 bytes hold the GRH
	WCWithImm     WCFlags = 1 << 1 // IBV_WC_WITH_IMM: WC.Imm is valid
	WCIPCsumOK    WCFlags = 1 << 2 // IBV_WC_IP_CSUM_OK
	WCWithInv     WCFlags = 1 << 3 // IBV_WC_WITH_INV: WC.InvalidatedRKey is valid
	WCTMSyncReq   WCFlags = 1 << 4 // IBV_WC_TM_SYNC_REQ
	WCTMMatch     WCFlags = 1 << 5 // IBV_WC_TM_MATCH
	WCTMDataValid WCFlags = 1 << 6 // IBV_WC_TM_DATA_VALID
)

// recvWCFlags are the flags of every successful receive completion, of
// any QP type: rxe's do_complete starts a user CQE's wc_flags at
// IB_WC_GRH whatever the QP (every RoCE packet came with its IP header,
// and mlx5 sets the flag from the CQE's GRH bits on RC too). Only UD and
// GSI place the GRH in the buffer.
const recvWCFlags = WCWithGRH

// WC is a work completion, like struct ibv_wc. It holds no pointers so a
// CQ can keep completions in a flat ring without allocating.
type WC struct {
	ID              uint64   // wr_id of the completed WR
	Status          WCStatus // SUCCESS or the error
	Opcode          WCOpcode // valid only when Status is SUCCESS (as in libibverbs); 0 otherwise, as rxe fills it
	VendorErr       uint32   // vendor_err
	ByteLen         uint32   // bytes received (receive completions); 0 when Status is not SUCCESS
	Imm             uint32   // immediate data, host order (Flags has WCWithImm)
	InvalidatedRKey uint32   // rkey invalidated by SEND_WITH_INV (Flags has WCWithInv)
	QPNum           uint32   // local QP the WR belonged to
	SrcQP           uint32   // UD: remote QPN
	Flags           WCFlags  // wc_flags
	PKeyIndex       uint16   // pkey_index
	SLID            uint16   // slid (0 on RoCE)
	SL              uint8    // sl
	DLIDPathBits    uint8    // dlid_path_bits
	// Solicited reports that the message that produced this receive
	// completion had the solicited event bit set. libibverbs has no field
	// for it (the kernel uses it to wake solicited-only CQ waiters); the CQ
	// uses it to decide whether a solicited-only notification fires.
	Solicited bool
}

// String summarises wc for logs.
func (wc *WC) String() string {
	return fmt.Sprintf("wc{id=%d status=%s opcode=%s len=%d qp=%#x}", wc.ID, wc.Status, wc.Opcode, wc.ByteLen, wc.QPNum)
}
