package mad

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Sizes of a SIDR_REP's variable areas.
const (
	SIDRREPInfoLen    = 72  // additional information (ClassPortInfo on redirect)
	SIDRREPPrivateLen = 136 // private data
)

// SIDRREP is ServiceIDResolutionResponse (IBA 12.11.2). Offsets in the
// data area:
//
//	0: request ID | 4: status | 5: additional information length
//	6: vendor ID high(16) | 8: QPN(24) vendor ID low(8) | 12: service ID
//	20: Q_Key | 24: additional information (72) | 96: private data (136)
type SIDRREP struct {
	RequestID uint32
	Status    SIDRStatus
	QPN       uint32 // 24 bits
	ServiceID uint64
	QKey      uint32
	// ClassPortInfo is the additional information area: the first
	// InfoLength bytes of it (nil when InfoLength is 0). IBA fills it
	// with a ClassPortInfo on SIDRRedirect; at most SIDRREPInfoLen bytes.
	ClassPortInfo []byte
	// PrivateData is the whole SIDRREPPrivateLen-byte area after Parse.
	PrivateData []byte
	// VendorID (24 bits) is an IBA 1.4 addition.
	VendorID uint32
}

const (
	sidrRepRequestID = 0
	sidrRepStatus    = 4
	sidrRepInfoLen   = 5
	sidrRepVendorIDH = 6
	sidrRepQPN       = 8
	sidrRepVendorIDL = 11
	sidrRepServiceID = 12
	sidrRepQKey      = 20
	sidrRepInfo      = 24
	sidrRepPrivate   = 96
)

// AttrID returns AttrSIDRREP.
func (*SIDRREP) AttrID() uint16 { return AttrSIDRREP }

// ParseSIDRREP decodes the DataLen data bytes of a SIDR_REP. An additional
// information length beyond its area is ErrBadField.
func ParseSIDRREP(data []byte) (*SIDRREP, error) {
	if err := checkData("SIDR_REP", data); err != nil {
		return nil, err
	}
	d := data
	infoLen := int(d[sidrRepInfoLen])
	if infoLen > SIDRREPInfoLen {
		return nil, fmt.Errorf("%w: SIDR_REP additional information length %d exceeds %d", ErrBadField, infoLen, SIDRREPInfoLen)
	}
	m := &SIDRREP{
		RequestID:   binary.BigEndian.Uint32(d[sidrRepRequestID:]),
		Status:      SIDRStatus(d[sidrRepStatus]),
		VendorID:    uint32(binary.BigEndian.Uint16(d[sidrRepVendorIDH:]))<<8 | uint32(d[sidrRepVendorIDL]),
		QPN:         be24(d[sidrRepQPN:]),
		ServiceID:   binary.BigEndian.Uint64(d[sidrRepServiceID:]),
		QKey:        binary.BigEndian.Uint32(d[sidrRepQKey:]),
		PrivateData: cloneArea(d[sidrRepPrivate : sidrRepPrivate+SIDRREPPrivateLen]),
	}
	if infoLen > 0 {
		m.ClassPortInfo = cloneArea(d[sidrRepInfo : sidrRepInfo+infoLen])
	}
	return m, nil
}

// Validate reports the fields of m that do not fit.
func (m *SIDRREP) Validate() error {
	const n = "SIDR_REP"
	var infoErr error
	if len(m.ClassPortInfo) > SIDRREPInfoLen {
		infoErr = fmt.Errorf("%w: SIDR_REP additional information of %d bytes, at most %d", ErrBadField, len(m.ClassPortInfo), SIDRREPInfoLen)
	}
	return errors.Join(
		checkBits(n, "QPN", m.QPN, 24),
		checkBits(n, "vendor ID", m.VendorID, 24),
		infoErr,
		checkPrivate(n, m.PrivateData, SIDRREPPrivateLen),
	)
}

// AppendData appends the DataLen data bytes of m; it panics if
// m.Validate fails.
func (m *SIDRREP) AppendData(b []byte) []byte {
	mustValid(m)
	b, d := growData(b)
	binary.BigEndian.PutUint32(d[sidrRepRequestID:], m.RequestID)
	d[sidrRepStatus] = uint8(m.Status)
	d[sidrRepInfoLen] = uint8(len(m.ClassPortInfo))
	binary.BigEndian.PutUint16(d[sidrRepVendorIDH:], uint16(m.VendorID>>8))
	put24(d[sidrRepQPN:], m.QPN)
	d[sidrRepVendorIDL] = byte(m.VendorID)
	binary.BigEndian.PutUint64(d[sidrRepServiceID:], m.ServiceID)
	binary.BigEndian.PutUint32(d[sidrRepQKey:], m.QKey)
	copy(d[sidrRepInfo:], m.ClassPortInfo)
	copy(d[sidrRepPrivate:], m.PrivateData)
	return b
}
