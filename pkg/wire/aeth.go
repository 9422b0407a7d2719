package wire

// AETH is a view of the 4-byte ACK Extended Transport Header:
// syndrome (1), message sequence number (3).
type AETH []byte

// Syndrome returns the syndrome byte.
func (h AETH) Syndrome() Syndrome { return Syndrome(h[0]) }

// SetSyndrome sets the syndrome byte.
func (h AETH) SetSyndrome(s Syndrome) { h[0] = byte(s) }

// MSN returns the 24-bit message sequence number.
func (h AETH) MSN() uint32 { return be24(h[1:]) }

// SetMSN sets the message sequence number (low 24 bits).
func (h AETH) SetMSN(v uint32) { putBE24(h[1:], v) }

// Syndrome is the AETH syndrome: bit 7 reserved, bits 6-5 the kind, bits
// 4-0 the credit count, RNR timer or NAK code.
type Syndrome uint8

// SyndromeKind is the class of an AETH syndrome.
type SyndromeKind uint8

// Syndrome kinds.
const (
	SynACK      SyndromeKind = iota // positive acknowledgement with credit count
	SynRNR                          // receiver-not-ready NAK with timer value
	SynNAK                          // NAK with a NAK code
	SynReserved                     // kind 10b, or bit 7 set
)

// String returns "ACK", "RNR_NAK", "NAK" or "RESERVED".
func (k SyndromeKind) String() string {
	switch k {
	case SynACK:
		return "ACK"
	case SynRNR:
		return "RNR_NAK"
	case SynNAK:
		return "NAK"
	}
	return "RESERVED"
}

// NAK codes (syndrome bits 4-0 when the kind is SynNAK).
const (
	NAKPSNSeqErr        = 0
	NAKInvalidRequest   = 1
	NAKRemoteAccess     = 2
	NAKRemoteOp         = 3
	NAKInvalidRDRequest = 4
)

// CreditsInvalid is the ACK credit count meaning "no credit information"
// (end-to-end flow control not used), which rxe always sends.
const CreditsInvalid = 0x1F

// ACKSyndrome returns an ACK syndrome with the given 5-bit credit count.
func ACKSyndrome(credits uint8) Syndrome { return Syndrome(credits & 0x1F) }

// RNRSyndrome returns an RNR NAK syndrome with the given 5-bit timer value.
func RNRSyndrome(timer uint8) Syndrome { return Syndrome(0x20 | timer&0x1F) }

// NAKSyndrome returns a NAK syndrome with the given 5-bit NAK code.
func NAKSyndrome(code uint8) Syndrome { return Syndrome(0x60 | code&0x1F) }

// Kind returns the syndrome's class.
func (s Syndrome) Kind() SyndromeKind {
	if s&0x80 != 0 {
		return SynReserved
	}
	switch s >> 5 {
	case 0:
		return SynACK
	case 1:
		return SynRNR
	case 3:
		return SynNAK
	}
	return SynReserved
}

// Value returns the low five bits (credits, RNR timer or NAK code).
func (s Syndrome) Value() uint8 { return uint8(s) & 0x1F }

// Credits returns the ACK credit count (meaningful for SynACK).
func (s Syndrome) Credits() uint8 { return s.Value() }

// RNRTimer returns the encoded RNR timer (meaningful for SynRNR).
func (s Syndrome) RNRTimer() uint8 { return s.Value() }

// NAKCode returns the NAK code (meaningful for SynNAK).
func (s Syndrome) NAKCode() uint8 { return s.Value() }

// NAKCodeName returns the IBA name of a NAK code, e.g. "PSN_SEQUENCE_ERROR".
func NAKCodeName(code uint8) string {
	switch code {
	case NAKPSNSeqErr:
		return "PSN_SEQUENCE_ERROR"
	case NAKInvalidRequest:
		return "INVALID_REQUEST"
	case NAKRemoteAccess:
		return "REMOTE_ACCESS_ERROR"
	case NAKRemoteOp:
		return "REMOTE_OPERATIONAL_ERROR"
	case NAKInvalidRDRequest:
		return "INVALID_RD_REQUEST"
	}
	return "RESERVED"
}
