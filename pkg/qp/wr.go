package qp

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/rxed/rxed/pkg/mr"
)

// SGE is one scatter/gather element, like struct ibv_sge: Length bytes at
// virtual address Addr inside the memory region whose local key is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// WROpcode is a send work request opcode with the enum ibv_wr_opcode values
// (WRRegMR has the kernel's IB_WR_REG_MR value; libibverbs has none).
type WROpcode uint32

// Send work request opcodes.
const (
	WRRDMAWrite         WROpcode = 0    // IBV_WR_RDMA_WRITE
	WRRDMAWriteWithImm  WROpcode = 1    // IBV_WR_RDMA_WRITE_WITH_IMM
	WRSend              WROpcode = 2    // IBV_WR_SEND
	WRSendWithImm       WROpcode = 3    // IBV_WR_SEND_WITH_IMM
	WRRDMARead          WROpcode = 4    // IBV_WR_RDMA_READ
	WRAtomicCmpAndSwp   WROpcode = 5    // IBV_WR_ATOMIC_CMP_AND_SWP
	WRAtomicFetchAndAdd WROpcode = 6    // IBV_WR_ATOMIC_FETCH_AND_ADD
	WRLocalInv          WROpcode = 7    // IBV_WR_LOCAL_INV
	WRBindMW            WROpcode = 8    // IBV_WR_BIND_MW
	WRSendWithInv       WROpcode = 9    // IBV_WR_SEND_WITH_INV
	WRTSO               WROpcode = 10   // IBV_WR_TSO (not supported, as in rxe)
	WRDriver1           WROpcode = 11   // IBV_WR_DRIVER1 (not supported)
	WRFlush             WROpcode = 14   // IBV_WR_FLUSH
	WRAtomicWrite       WROpcode = 15   // IBV_WR_ATOMIC_WRITE
	WRRegMR             WROpcode = 0x20 // IB_WR_REG_MR: fast registration
)

var wrOpcodeNames = map[WROpcode]string{
	WRRDMAWrite:         "RDMA_WRITE",
	WRRDMAWriteWithImm:  "RDMA_WRITE_WITH_IMM",
	WRSend:              "SEND",
	WRSendWithImm:       "SEND_WITH_IMM",
	WRRDMARead:          "RDMA_READ",
	WRAtomicCmpAndSwp:   "ATOMIC_CMP_AND_SWP",
	WRAtomicFetchAndAdd: "ATOMIC_FETCH_AND_ADD",
	WRLocalInv:          "LOCAL_INV",
	WRBindMW:            "BIND_MW",
	WRSendWithInv:       "SEND_WITH_INV",
	WRTSO:               "TSO",
	WRDriver1:           "DRIVER1",
	WRFlush:             "FLUSH",
	WRAtomicWrite:       "ATOMIC_WRITE",
	WRRegMR:             "REG_MR",
}

// String returns the libibverbs name without the IBV_WR_ prefix.
func (op WROpcode) String() string {
	if s, ok := wrOpcodeNames[op]; ok {
		return s
	}
	return "WROpcode(" + strconv.FormatUint(uint64(op), 10) + ")"
}

// wrTypes says which QP types accept an opcode at post time, as
// rxe_wr_opcode_info does: bit t for Type t. GSI behaves as UD, except
// that rxe's table has SEND_WITH_INV for UD and not for GSI. Accepted is
// not sendable: UC and UD have no SEND_WITH_INV packet, and rxe's
// next_opcode fails such a WQE with LOC_QP_OP_ERR (requester.go's
// requestHeaders does the same). An array, not a map: every post looks
// its opcode up here.
var wrTypes = [WRRegMR + 1]uint8{
	WRRDMAWrite:         types(RC, UC),
	WRRDMAWriteWithImm:  types(RC, UC),
	WRSend:              types(RC, UC, UD, GSI),
	WRSendWithImm:       types(RC, UC, UD, GSI),
	WRRDMARead:          types(RC),
	WRAtomicCmpAndSwp:   types(RC),
	WRAtomicFetchAndAdd: types(RC),
	WRLocalInv:          types(RC),
	WRBindMW:            types(RC, UC),
	WRSendWithInv:       types(RC, UC, UD),
	WRFlush:             types(RC),
	WRAtomicWrite:       types(RC),
	WRRegMR:             types(RC),
}

// types is the set of ts as wrTypes holds it.
func types(ts ...Type) uint8 {
	var m uint8
	for _, t := range ts {
		m |= 1 << t
	}
	return m
}

// ValidFor reports whether a QP of type t accepts op.
func (op WROpcode) ValidFor(t Type) bool {
	return int(op) < len(wrTypes) && t.Valid() && wrTypes[op]&(1<<t) != 0
}

// IsLocal reports whether op is carried out locally without a packet
// (LOCAL_INV, BIND_MW, REG_MR).
func (op WROpcode) IsLocal() bool {
	return op == WRLocalInv || op == WRBindMW || op == WRRegMR
}

// IsAtomic reports whether op is a compare-and-swap or fetch-and-add.
func (op WROpcode) IsAtomic() bool {
	return op == WRAtomicCmpAndSwp || op == WRAtomicFetchAndAdd
}

// IsSend reports whether op consumes a receive WR at the peer.
func (op WROpcode) IsSend() bool {
	return op == WRSend || op == WRSendWithImm || op == WRSendWithInv
}

// HasImm reports whether op carries immediate data.
func (op WROpcode) HasImm() bool {
	return op == WRSendWithImm || op == WRRDMAWriteWithImm
}

// AllowsInline reports whether op may carry inline data (sends and writes).
func (op WROpcode) AllowsInline() bool {
	switch op {
	case WRSend, WRSendWithImm, WRSendWithInv, WRRDMAWrite, WRRDMAWriteWithImm:
		return true
	}
	return false
}

// WCOpcode returns the completion opcode the requester reports for op, as
// rxe's wr_to_wc_opcode does; ok is false for an opcode without one.
func (op WROpcode) WCOpcode() (wc WCOpcode, ok bool) {
	switch op {
	case WRRDMAWrite, WRRDMAWriteWithImm:
		return WCRDMAWrite, true
	case WRSend, WRSendWithImm, WRSendWithInv:
		return WCSend, true
	case WRRDMARead:
		return WCRDMARead, true
	case WRAtomicCmpAndSwp:
		return WCCompSwap, true
	case WRAtomicFetchAndAdd:
		return WCFetchAdd, true
	case WRLocalInv:
		return WCLocalInv, true
	case WRBindMW:
		return WCBindMW, true
	case WRRegMR:
		return WCRegMR, true
	case WRFlush:
		return WCFlush, true
	case WRAtomicWrite:
		return WCAtomicWrite, true
	}
	return 0, false
}

// SendFlags modify a send WR, with the enum ibv_send_flags values.
type SendFlags uint32

// Send flags.
const (
	Fence     SendFlags = 1 << 0 // IBV_SEND_FENCE: wait for earlier reads/atomics first
	Signaled  SendFlags = 1 << 1 // IBV_SEND_SIGNALED: generate a completion on success
	Solicited SendFlags = 1 << 2 // IBV_SEND_SOLICITED: set the solicited event bit
	Inline    SendFlags = 1 << 3 // IBV_SEND_INLINE: data copied at post time (SendWR.Inline)
	IPCsum    SendFlags = 1 << 4 // IBV_SEND_IP_CSUM (not supported)
)

// String lists the set flags, e.g. "SIGNALED|SOLICITED".
func (f SendFlags) String() string {
	if f == 0 {
		return "0"
	}
	names := [...]string{"FENCE", "SIGNALED", "SOLICITED", "INLINE", "IP_CSUM"}
	s := ""
	for i, n := range names {
		if f&(1<<i) != 0 {
			if s != "" {
				s += "|"
			}
			s += n
		}
	}
	if rest := f &^ (1<<len(names) - 1); rest != 0 {
		if s != "" {
			s += "|"
		}
		s += fmt.Sprintf("%#x", uint32(rest))
	}
	return s
}

// MWBindInfo describes a memory window bind (WRBindMW), like struct
// ibv_mw_bind plus ibv_mw_bind_info. Objects are named by their keys
// (the engine resolves them in its pkg/mr table); the rights are
// pkg/mr's Access.
type MWBindInfo struct {
	MWRKey  uint32    // current rkey of the window to bind
	NewRKey uint32    // rkey the window gets (type 2: key part changed by the consumer)
	MRLKey  uint32    // lkey of the region the window lies in; 0 with Length 0 unbinds
	Addr    uint64    // start of the window inside the region
	Length  uint64    // window length; 0 unbinds
	Access  mr.Access // IBV_ACCESS_* remote rights of the window
}

// RegMRInfo describes a fast registration (WRRegMR), like the kernel's
// struct ib_reg_wr.
type RegMRInfo struct {
	MRLKey uint32    // current lkey of the fast-registration region
	NewKey uint32    // key the region gets (its 8-bit key part changed)
	Access mr.Access // IBV_ACCESS_* rights granted
	IOVA   uint64    // address the region starts at after registration
	Length uint64    // length mapped
}

// SendWR is a send work request, like struct ibv_send_wr without the
// next pointer: post a slice instead.
type SendWR struct {
	ID     uint64    // wr_id, returned in the completion
	Opcode WROpcode  // what to do
	Flags  SendFlags // FENCE, SIGNALED, SOLICITED, INLINE
	SGL    []SGE     // local memory; ignored when Flags has Inline
	// Inline is the payload when Flags has Inline: copied at post time, so
	// the caller may reuse it as soon as the post returns. Go has no raw
	// pointers, so inline data is given as bytes instead of SGEs.
	Inline []byte
	// Imm is the immediate data for *_WITH_IMM, as a host-order number; it
	// travels big-endian in the ImmDt header and arrives in WC.Imm.
	Imm uint32
	// InvalidateRKey is the rkey the peer invalidates for SEND_WITH_INV,
	// or the key to invalidate locally for LOCAL_INV.
	InvalidateRKey uint32

	RemoteAddr uint64 // RDMA and atomic target address
	RKey       uint32 // RDMA and atomic target key
	CompareAdd uint64 // compare value (CMP_AND_SWP) or addend (FETCH_AND_ADD)
	Swap       uint64 // swap value (CMP_AND_SWP)

	AV         AddrVector // UD/GSI: destination path (ibv_ah)
	RemoteQPN  uint32     // UD/GSI: destination QPN
	RemoteQKey uint32     // UD: Q_Key, high bit set means the QP's own (qkey.go); GSI: always GSIQKey

	Bind MWBindInfo // BIND_MW
	Reg  RegMRInfo  // REG_MR
}

// Len returns the message length: the inline payload, or the sum of the
// SGE lengths. For atomics it is 8 regardless (the operand size).
func (wr *SendWR) Len() uint64 {
	if wr.Opcode.IsAtomic() {
		return 8
	}
	if wr.Flags&Inline != 0 {
		return uint64(len(wr.Inline))
	}
	return sglLen(wr.SGL)
}

// sglLen is the bytes an SGL covers.
func sglLen(sgl []SGE) uint64 {
	var n uint64
	for _, s := range sgl {
		n += uint64(s.Length)
	}
	return n
}

// RecvWR is a receive work request, like struct ibv_recv_wr without the
// next pointer. On UD the first 40 bytes receive the GRH (or the IPv4
// header padded like rxe does).
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// Len returns the total buffer length of the SGE list.
func (wr *RecvWR) Len() uint64 { return sglLen(wr.SGL) }

// Limits an engine places on messages (rxe_param.h values by default).
const (
	MaxMsgSize = 1 << 31 // RXE_MAX_MSG_SIZE: largest message in bytes
)

// Errors from CheckSendWR and CheckRecvWR; test with errors.Is.
var (
	ErrBadOpcode     = errors.New("qp: opcode not supported on this QP type")
	ErrTooManySGE    = errors.New("qp: too many scatter/gather entries")
	ErrInlineTooLong = errors.New("qp: inline data longer than max_inline_data")
	ErrInlineOpcode  = errors.New("qp: inline data not allowed for this opcode")
	ErrMsgTooLong    = errors.New("qp: message too long")
	ErrBadFlags      = errors.New("qp: unsupported send flags")
	ErrAtomicAlign   = errors.New("qp: atomic remote address not 8-byte aligned")
	ErrAtomicSGE     = errors.New("qp: atomic needs at least 8 bytes of local SGEs")
	ErrNoUDDest      = errors.New("qp: UD send without a destination address")
)

// CheckSendWR validates wr for a QP of type t with capabilities c, before
// anything is queued, like rxe's validate_send_wr. It changes nothing.
func CheckSendWR(t Type, c Cap, wr *SendWR) error {
	if !wr.Opcode.ValidFor(t) {
		return fmt.Errorf("%w: %v on %v", ErrBadOpcode, wr.Opcode, t)
	}
	if wr.Flags&^(Fence|Signaled|Solicited|Inline) != 0 {
		return fmt.Errorf("%w: %v", ErrBadFlags, wr.Flags)
	}
	if wr.Opcode.IsLocal() {
		return nil
	}
	if wr.Flags&Inline != 0 {
		if !wr.Opcode.AllowsInline() {
			return fmt.Errorf("%w: %v", ErrInlineOpcode, wr.Opcode)
		}
		if uint64(len(wr.Inline)) > uint64(c.MaxInlineData) {
			return fmt.Errorf("%w: %d > %d", ErrInlineTooLong, len(wr.Inline), c.MaxInlineData)
		}
	} else if uint64(len(wr.SGL)) > uint64(c.MaxSendSGE) {
		return fmt.Errorf("%w: %d > max_send_sge %d", ErrTooManySGE, len(wr.SGL), c.MaxSendSGE)
	}
	if wr.Opcode.IsAtomic() {
		if wr.RemoteAddr&7 != 0 {
			return fmt.Errorf("%w: %#x", ErrAtomicAlign, wr.RemoteAddr)
		}
		// rxe's validate_send_wr wants at least the 8 bytes of the
		// original value, in as many SGEs as the QP allows: the result
		// is scattered over them.
		if n := sglLen(wr.SGL); n < 8 {
			return fmt.Errorf("%w: %d bytes", ErrAtomicSGE, n)
		}
		return nil
	}
	n := wr.Len()
	if n > MaxMsgSize {
		return fmt.Errorf("%w: %d > %d", ErrMsgTooLong, n, MaxMsgSize)
	}
	// A UD message longer than the MTU is not refused here (rxe's
	// validate_send_wr does not either): it completes unsent with SUCCESS
	// (IBA C10-93.1.1, ud_toolong.go).
	if t.Datagram() && !wr.AV.DGID.IsValid() {
		return ErrNoUDDest
	}
	return nil
}

// CheckRecvWR validates wr against a receive queue allowing maxSGE
// entries. It changes nothing.
func CheckRecvWR(maxSGE uint32, wr *RecvWR) error {
	if uint64(len(wr.SGL)) > uint64(maxSGE) {
		return fmt.Errorf("%w: %d > max_recv_sge %d", ErrTooManySGE, len(wr.SGL), maxSGE)
	}
	if n := wr.Len(); n > MaxMsgSize {
		return fmt.Errorf("%w: %d > %d", ErrMsgTooLong, n, MaxMsgSize)
	}
	return nil
}
