package wire

import (
	"math/bits"
	"strconv"
)

// Opcode is the BTH OpCode byte. The top three bits select the transport
// (RC, UC, RD, UD, CNP, XRC, manufacturer), the low five bits the operation.
type Opcode uint8

// Opcodes named after rdma_rxe's IB_OPCODE_* constants.
const (
	RCSendFirst          Opcode = 0x00
	RCSendMiddle         Opcode = 0x01
	RCSendLast           Opcode = 0x02
	RCSendLastImm        Opcode = 0x03
	RCSendOnly           Opcode = 0x04
	RCSendOnlyImm        Opcode = 0x05
	RCWriteFirst         Opcode = 0x06
	RCWriteMiddle        Opcode = 0x07
	RCWriteLast          Opcode = 0x08
	RCWriteLastImm       Opcode = 0x09
	RCWriteOnly          Opcode = 0x0A
	RCWriteOnlyImm       Opcode = 0x0B
	RCReadRequest        Opcode = 0x0C
	RCReadResponseFirst  Opcode = 0x0D
	RCReadResponseMiddle Opcode = 0x0E
	RCReadResponseLast   Opcode = 0x0F
	RCReadResponseOnly   Opcode = 0x10
	RCAck                Opcode = 0x11
	RCAtomicAck          Opcode = 0x12
	RCCompareSwap        Opcode = 0x13
	RCFetchAdd           Opcode = 0x14
	RCSendLastInv        Opcode = 0x16
	RCSendOnlyInv        Opcode = 0x17
	RCFlush              Opcode = 0x1C
	RCAtomicWrite        Opcode = 0x1D

	UCSendFirst    Opcode = 0x20
	UCSendMiddle   Opcode = 0x21
	UCSendLast     Opcode = 0x22
	UCSendLastImm  Opcode = 0x23
	UCSendOnly     Opcode = 0x24
	UCSendOnlyImm  Opcode = 0x25
	UCWriteFirst   Opcode = 0x26
	UCWriteMiddle  Opcode = 0x27
	UCWriteLast    Opcode = 0x28
	UCWriteLastImm Opcode = 0x29
	UCWriteOnly    Opcode = 0x2A
	UCWriteOnlyImm Opcode = 0x2B

	UDSendOnly    Opcode = 0x64
	UDSendOnlyImm Opcode = 0x65

	// CNP is the RoCEv2 Congestion Notification Packet (Annex A17).
	CNP Opcode = 0x81
)

// Transport is the transport service an opcode belongs to (its top three bits,
// with CNP split out of the 0x80 range).
type Transport uint8

// Transports. Only RC, UC, UD and CNP are supported by rdma_rxe (and rxed).
const (
	TransportReserved Transport = iota
	TransportRC
	TransportUC
	TransportRD
	TransportUD
	TransportCNP
	TransportXRC
	TransportVendor
)

var transportNames = [...]string{"reserved", "RC", "UC", "RD", "UD", "CNP", "XRC", "vendor"}

// String returns the conventional short name ("RC", "UD", ...).
func (t Transport) String() string {
	if int(t) < len(transportNames) {
		return transportNames[t]
	}
	return "Transport(" + strconv.Itoa(int(t)) + ")"
}

// HeaderSet is a set of extension headers that follow the BTH.
type HeaderSet uint16

// Extension header bits. Wire order is fixed by IBA and given by
// OpInfo.Order, not by the bit order.
const (
	HdrRETH HeaderSet = 1 << iota
	HdrAETH
	HdrAtomicETH
	HdrAtomicAckETH
	HdrDETH
	HdrImmDt
	HdrIETH
	HdrFETH
	HdrCNP
	// HdrRDETH and HdrXRCETH are only used by the unsupported RD and XRC
	// opcodes; they let the table describe those opcodes faithfully.
	HdrRDETH
	HdrXRCETH
)

// Has reports whether every header in h2 is in h.
func (h HeaderSet) Has(h2 HeaderSet) bool { return h&h2 == h2 }

// hdrDesc holds the name and wire length of each HeaderSet bit, indexed by
// the bit's position.
var hdrDesc = [...]struct {
	name string
	len  int
}{
	{"RETH", RETHLen},
	{"AETH", AETHLen},
	{"AtomicETH", AtomicETHLen},
	{"AtomicAckETH", AtomicAckETHLen},
	{"DETH", DETHLen},
	{"ImmDt", ImmDtLen},
	{"IETH", IETHLen},
	{"FETH", FETHLen},
	{"CNP", CNPLen},
	{"RDETH", RDETHLen},
	{"XRCETH", XRCETHLen},
}

// bit returns the position of a single-bit set's bit, or -1 for a set of
// zero or several headers or an unknown bit.
func (h HeaderSet) bit() int {
	i := bits.TrailingZeros16(uint16(h))
	if h == 0 || h&(h-1) != 0 || i >= len(hdrDesc) {
		return -1
	}
	return i
}

// Name returns the header's name as Wireshark and Scapy spell it ("RETH",
// "ImmDt", ...). It is meant for single-bit sets.
func (h HeaderSet) Name() string {
	if i := h.bit(); i >= 0 {
		return hdrDesc[i].name
	}
	return "HeaderSet(" + strconv.Itoa(int(h)) + ")"
}

// Len returns the wire length of a single header bit.
func (h HeaderSet) Len() int {
	if i := h.bit(); i >= 0 {
		return hdrDesc[i].len
	}
	return 0
}

// OpFlags describe what an opcode does.
type OpFlags uint32

// Opcode properties.
const (
	FlagPayload OpFlags = 1 << iota // carries a payload (possibly empty)
	FlagFirst                       // first packet of a multi-packet message
	FlagMiddle
	FlagLast
	FlagOnly // single-packet message
	FlagImm  // carries ImmDt
	FlagInv  // carries IETH (send with invalidate)
	FlagRequest
	FlagResponse
	FlagSend
	FlagWrite
	FlagRead
	FlagAtomic
	FlagAck
	FlagFlush
	FlagAtomicWrite
)

// Has reports whether every flag in f2 is set in f.
func (f OpFlags) Has(f2 OpFlags) bool { return f&f2 == f2 }

// MaxHeaders is the largest number of extension headers any opcode has.
const MaxHeaders = 4

// OpInfo describes one opcode. Obtain it with Opcode.Info; never modify it.
type OpInfo struct {
	Name      string // rxe/IBA name without the IB_OPCODE_ prefix, e.g. "RC_SEND_FIRST"
	Transport Transport
	Headers   HeaderSet
	Flags     OpFlags
	// HdrLen is the BTH plus the extension headers (no payload, pad or
	// ICRC). It is only meaningful when Defined; use Opcode.HeaderLen to
	// get an error instead of a length for undefined opcodes.
	HdrLen int
	// Defined: IBA (or the RoCEv2 annex) assigns the opcode. Supported:
	// rdma_rxe implements it; Parse rejects everything else with ErrBadOpcode.
	Defined, Supported bool
	// Order lists Headers in wire order; the first NHeaders entries are valid.
	Order    [MaxHeaders]HeaderSet
	NHeaders int
	// Offsets[i] is the offset of Order[i] from the start of the BTH.
	Offsets [MaxHeaders]int
}

// HeaderOrder returns the extension headers in wire order (a sub-slice of
// an array inside the table: do not modify).
func (i *OpInfo) HeaderOrder() []HeaderSet { return i.Order[:i.NHeaders] }

// Offset returns the offset of header h from the start of the BTH, or -1
// if the opcode does not carry h.
func (i *OpInfo) Offset(h HeaderSet) int {
	for k := 0; k < i.NHeaders; k++ {
		if i.Order[k] == h {
			return i.Offsets[k]
		}
	}
	return -1
}

// Info returns the opcode's table entry; never nil.
func (op Opcode) Info() *OpInfo { return &opTable[op] }

// String returns the opcode's name, or "OPCODE_0xNN" for an undefined one.
func (op Opcode) String() string {
	if in := &opTable[op]; in.Name != "" {
		return in.Name
	}
	const hexdig = "0123456789ABCDEF"
	return "OPCODE_0x" + string([]byte{hexdig[op>>4], hexdig[op&15]})
}

// HeaderLen returns the length of the BTH and extension headers, or
// ErrBadOpcode when the opcode is reserved (so that no caller mistakes an
// unknown opcode for a header-only packet).
func (op Opcode) HeaderLen() (int, error) {
	in := &opTable[op]
	if !in.Defined {
		return 0, ErrBadOpcode
	}
	return in.HdrLen, nil
}

// opTable is built once at init from the per-transport templates below.
var opTable [256]OpInfo

// opTemplate is one operation of the RC/UC/RD/XRC opcode space, indexed by
// the low five bits.
type opTemplate struct {
	name    string
	headers []HeaderSet
	flags   OpFlags
}

// rcOps is the IBA operation list shared by RC, UC (0x00-0x0B), RD and XRC.
var rcOps = [32]opTemplate{
	0x00: {"SEND_FIRST", nil, FlagPayload | FlagFirst | FlagSend | FlagRequest},
	0x01: {"SEND_MIDDLE", nil, FlagPayload | FlagMiddle | FlagSend | FlagRequest},
	0x02: {"SEND_LAST", nil, FlagPayload | FlagLast | FlagSend | FlagRequest},
	0x03: {"SEND_LAST_WITH_IMMEDIATE", []HeaderSet{HdrImmDt}, FlagPayload | FlagLast | FlagImm | FlagSend | FlagRequest},
	0x04: {"SEND_ONLY", nil, FlagPayload | FlagOnly | FlagSend | FlagRequest},
	0x05: {"SEND_ONLY_WITH_IMMEDIATE", []HeaderSet{HdrImmDt}, FlagPayload | FlagOnly | FlagImm | FlagSend | FlagRequest},
	0x06: {"RDMA_WRITE_FIRST", []HeaderSet{HdrRETH}, FlagPayload | FlagFirst | FlagWrite | FlagRequest},
	0x07: {"RDMA_WRITE_MIDDLE", nil, FlagPayload | FlagMiddle | FlagWrite | FlagRequest},
	0x08: {"RDMA_WRITE_LAST", nil, FlagPayload | FlagLast | FlagWrite | FlagRequest},
	0x09: {"RDMA_WRITE_LAST_WITH_IMMEDIATE", []HeaderSet{HdrImmDt}, FlagPayload | FlagLast | FlagImm | FlagWrite | FlagRequest},
	0x0A: {"RDMA_WRITE_ONLY", []HeaderSet{HdrRETH}, FlagPayload | FlagOnly | FlagWrite | FlagRequest},
	0x0B: {"RDMA_WRITE_ONLY_WITH_IMMEDIATE", []HeaderSet{HdrRETH, HdrImmDt}, FlagPayload | FlagOnly | FlagImm | FlagWrite | FlagRequest},
	0x0C: {"RDMA_READ_REQUEST", []HeaderSet{HdrRETH}, FlagOnly | FlagRead | FlagRequest},
	0x0D: {"RDMA_READ_RESPONSE_FIRST", []HeaderSet{HdrAETH}, FlagPayload | FlagFirst | FlagRead | FlagResponse},
	0x0E: {"RDMA_READ_RESPONSE_MIDDLE", nil, FlagPayload | FlagMiddle | FlagRead | FlagResponse},
	0x0F: {"RDMA_READ_RESPONSE_LAST", []HeaderSet{HdrAETH}, FlagPayload | FlagLast | FlagRead | FlagResponse},
	0x10: {"RDMA_READ_RESPONSE_ONLY", []HeaderSet{HdrAETH}, FlagPayload | FlagOnly | FlagRead | FlagResponse},
	0x11: {"ACKNOWLEDGE", []HeaderSet{HdrAETH}, FlagOnly | FlagAck | FlagResponse},
	0x12: {"ATOMIC_ACKNOWLEDGE", []HeaderSet{HdrAETH, HdrAtomicAckETH}, FlagOnly | FlagAck | FlagAtomic | FlagResponse},
	0x13: {"COMPARE_SWAP", []HeaderSet{HdrAtomicETH}, FlagOnly | FlagAtomic | FlagRequest},
	0x14: {"FETCH_ADD", []HeaderSet{HdrAtomicETH}, FlagOnly | FlagAtomic | FlagRequest},
	0x16: {"SEND_LAST_WITH_INVALIDATE", []HeaderSet{HdrIETH}, FlagPayload | FlagLast | FlagInv | FlagSend | FlagRequest},
	0x17: {"SEND_ONLY_WITH_INVALIDATE", []HeaderSet{HdrIETH}, FlagPayload | FlagOnly | FlagInv | FlagSend | FlagRequest},
	// IBA 1.5 memory placement extensions, as rdma_rxe (Linux >= 6.2) has them.
	0x1C: {"FLUSH", []HeaderSet{HdrFETH, HdrRETH}, FlagOnly | FlagFlush | FlagRequest},
	0x1D: {"ATOMIC_WRITE", []HeaderSet{HdrRETH}, FlagPayload | FlagOnly | FlagAtomicWrite | FlagRequest},
}

func init() {
	add := func(op Opcode, name string, t Transport, hdrs []HeaderSet, flags OpFlags, supported bool) {
		in := &opTable[op]
		in.Name, in.Transport, in.Flags = name, t, flags
		in.Defined, in.Supported = true, supported
		off := BTHLen
		for k, h := range hdrs {
			in.Headers |= h
			in.Order[k] = h
			in.Offsets[k] = off
			off += h.Len()
		}
		in.NHeaders = len(hdrs)
		in.HdrLen = off
	}
	for low := 0; low < 32; low++ {
		t := rcOps[low]
		if t.name == "" {
			continue
		}
		add(Opcode(0x00|low), "RC_"+t.name, TransportRC, t.headers, t.flags, true)
		// XRC mirrors RC 0x00-0x17 with an XRCETH first; unsupported.
		if low <= 0x17 {
			add(Opcode(0xA0|low), "XRC_"+t.name, TransportXRC, append([]HeaderSet{HdrXRCETH}, t.headers...), t.flags, false)
		}
		// UC has only SEND and RDMA WRITE (0x00-0x0B).
		if low <= 0x0B {
			add(Opcode(0x20|low), "UC_"+t.name, TransportUC, t.headers, t.flags, true)
		}
		// RD has 0x00-0x14 with RDETH + DETH in front; unsupported.
		if low <= 0x14 {
			hd := []HeaderSet{HdrRDETH, HdrDETH}
			if low == 0x11 || low == 0x12 || (low >= 0x0D && low <= 0x10) {
				hd = []HeaderSet{HdrRDETH} // responses carry no DETH
			}
			add(Opcode(0x40|low), "RD_"+t.name, TransportRD, append(hd, t.headers...), t.flags, false)
		}
	}
	add(0x55, "RD_RESYNC", TransportRD, []HeaderSet{HdrRDETH, HdrDETH}, FlagOnly|FlagRequest, false)
	add(UDSendOnly, "UD_SEND_ONLY", TransportUD, []HeaderSet{HdrDETH}, rcOps[0x04].flags, true)
	add(UDSendOnlyImm, "UD_SEND_ONLY_WITH_IMMEDIATE", TransportUD, []HeaderSet{HdrDETH, HdrImmDt}, rcOps[0x05].flags, true)
	add(CNP, "CNP", TransportCNP, []HeaderSet{HdrCNP}, 0, true)
	const hexdig = "0123456789ABCDEF"
	for op := 0xE0; op <= 0xFF; op++ {
		add(Opcode(op), "VENDOR_0x"+string([]byte{hexdig[op>>4], hexdig[op&15]}), TransportVendor, nil, 0, false)
	}
	// Reserved entries keep their transport for diagnostics.
	for op := range opTable {
		in := &opTable[op]
		if in.Defined {
			continue
		}
		switch op >> 5 {
		case 0:
			in.Transport = TransportRC
		case 1:
			in.Transport = TransportUC
		case 2:
			in.Transport = TransportRD
		case 3:
			in.Transport = TransportUD
		case 5:
			in.Transport = TransportXRC
		}
	}
}
