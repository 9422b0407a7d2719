package mad

import (
	"errors"
	"fmt"
	"slices"
)

// Sizes of a MAD on QP 1: a 24-byte common header and 232 bytes of
// attribute data.
const (
	MADLen    = 256
	HeaderLen = 24
	DataLen   = MADLen - HeaderLen // 232
)

// Header values of every CM MAD (IBA 13.4.2 and 12.6): the CM class speaks
// class version 2 and sends each message unsolicited with method SEND.
const (
	BaseVersion    = 1
	ClassCM        = 0x07
	CMClassVersion = 2
	MethodSend     = 0x03
)

// CM attribute IDs (IBA table 104).
const (
	AttrClassPortInfo = 0x0001
	AttrREQ           = 0x0010
	AttrMRA           = 0x0011
	AttrREJ           = 0x0012
	AttrREP           = 0x0013
	AttrRTU           = 0x0014
	AttrDREQ          = 0x0015
	AttrDREP          = 0x0016
	AttrSIDRREQ       = 0x0017
	AttrSIDRREP       = 0x0018
	AttrLAP           = 0x0019
	AttrAPR           = 0x001A
)

// Errors returned by the parsers and by Validate. Each error wraps one of
// these; test with errors.Is.
var (
	// ErrTruncated: the buffer is shorter than the structure.
	ErrTruncated = errors.New("mad: truncated")
	// ErrBadLength: a whole MAD longer than MADLen, or message data
	// longer than DataLen (the wire format has exactly one length).
	ErrBadLength = errors.New("mad: bad length")
	// ErrBadVersion: base version not 1, CM class version not 2, or
	// an rdma_cm header version not 0.
	ErrBadVersion = errors.New("mad: bad version")
	// ErrBadClass: management class not CM.
	ErrBadClass = errors.New("mad: not a CM MAD")
	// ErrBadMethod: method not SEND.
	ErrBadMethod = errors.New("mad: bad method")
	// ErrUnknownAttr: an attribute this package does not decode
	// (ClassPortInfo, LAP, APR, or an undefined ID).
	ErrUnknownAttr = errors.New("mad: unknown attribute")
	// ErrBadField: a field value outside its range (on Parse: a length
	// field beyond its area; on Validate/Append: a value wider than its
	// bit field, private data too long, an invalid address).
	ErrBadField = errors.New("mad: bad field")
)

// Message is one CM message: the 232 data bytes of a MAD with a given
// attribute ID. *REQ, *MRA, *REJ, *REP, *RTU, *DREQ, *DREP, *SIDRREQ and
// *SIDRREP implement it.
type Message interface {
	// AttrID is the MAD attribute ID of the message.
	AttrID() uint16
	// AppendData appends exactly DataLen bytes: the fields at their
	// offsets, reserved bits zero, private data padded with zeros. It
	// panics if Validate fails; use Validate or Marshal when the
	// fields come from outside the program.
	AppendData(b []byte) []byte
	// Validate reports every field that does not fit the wire format
	// (joined with errors.Join), each wrapping ErrBadField.
	Validate() error
}

// Parse decodes a whole CM MAD: exactly MADLen bytes, base version 1,
// class CM, class version 2, method SEND. It dispatches by attribute ID and
// returns *REQ, *MRA, *REJ, *REP, *RTU, *DREQ, *DREP, *SIDRREQ or
// *SIDRREP. The header is returned whenever it could be read (so that a
// caller may, for instance, answer an unknown attribute), the message only
// with a nil error. The message does not alias b.
func Parse(b []byte) (Header, Message, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return h, nil, err
	}
	if len(b) < MADLen {
		return h, nil, fmt.Errorf("%w: MAD of %d bytes, want %d", ErrTruncated, len(b), MADLen)
	}
	if len(b) > MADLen {
		return h, nil, fmt.Errorf("%w: MAD of %d bytes, want %d", ErrBadLength, len(b), MADLen)
	}
	if err := h.checkCM(); err != nil {
		return h, nil, err
	}
	m, err := ParseData(h.AttrID, b[HeaderLen:])
	return h, m, err
}

// ParseData decodes the DataLen data bytes of a CM message with attribute
// ID attr.
func ParseData(attr uint16, data []byte) (Message, error) {
	var (
		m   Message
		err error
	)
	switch attr {
	case AttrREQ:
		m, err = ParseREQ(data)
	case AttrMRA:
		m, err = ParseMRA(data)
	case AttrREJ:
		m, err = ParseREJ(data)
	case AttrREP:
		m, err = ParseREP(data)
	case AttrRTU:
		m, err = ParseRTU(data)
	case AttrDREQ:
		m, err = ParseDREQ(data)
	case AttrDREP:
		m, err = ParseDREP(data)
	case AttrSIDRREQ:
		m, err = ParseSIDRREQ(data)
	case AttrSIDRREP:
		m, err = ParseSIDRREP(data)
	default:
		return nil, fmt.Errorf("%w: attribute ID %#04x", ErrUnknownAttr, attr)
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// CMHeader returns the header of a CM MAD carrying m with transaction ID
// tid.
func CMHeader(tid uint64, m Message) Header {
	return Header{
		BaseVersion:  BaseVersion,
		MgmtClass:    ClassCM,
		ClassVersion: CMClassVersion,
		Method:       MethodSend,
		TID:          tid,
		AttrID:       m.AttrID(),
	}
}

// Append appends a whole MADLen-byte CM MAD (header and data) carrying m
// with transaction ID tid. Like AppendData it panics when m.Validate
// fails; Marshal returns the error instead.
func Append(b []byte, tid uint64, m Message) []byte {
	b = CMHeader(tid, m).Append(b)
	return m.AppendData(b)
}

// Marshal validates m and returns a new MADLen-byte CM MAD carrying it
// with transaction ID tid.
func Marshal(tid uint64, m Message) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return Append(make([]byte, 0, MADLen), tid, m), nil
}

// growData extends b by DataLen zero bytes and returns the new slice and
// the data area.
func growData(b []byte) (out, data []byte) {
	n := len(b)
	b = slices.Grow(b, DataLen)[:n+DataLen]
	data = b[n:]
	clear(data)
	return b, data
}

// checkData checks the length of a message's data area.
func checkData(name string, data []byte) error {
	if len(data) < DataLen {
		return fmt.Errorf("%w: %s data of %d bytes, want %d", ErrTruncated, name, len(data), DataLen)
	}
	if len(data) > DataLen {
		return fmt.Errorf("%w: %s data of %d bytes, want %d", ErrBadLength, name, len(data), DataLen)
	}
	return nil
}

// mustValid panics with m's validation error: appending a message whose
// fields do not fit is a bug in the caller (see Message.AppendData).
func mustValid(m Message) {
	if err := m.Validate(); err != nil {
		panic(err)
	}
}
