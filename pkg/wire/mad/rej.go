package mad

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Sizes of a REJ's variable areas.
const (
	REJARILen     = 72  // additional rejection information
	REJPrivateLen = 148 // private data
)

// Values of REJ.MessageRejected: which message the REJ answers.
const (
	REJMsgREQ   = 0
	REJMsgREP   = 1
	REJMsgOther = 2
)

// REJ is Reject (IBA 12.6.7). Offsets in the data area:
//
//	0: local comm ID (cm.c: the REQ's bytes 4-7, normally 0, when answering a REQ that matched nothing) | 4: remote comm ID
//	8: message rejected(2) reserved(6) | 9: ARI length(7) reserved(1)
//	10: reason | 12: ARI (72) | 84: private data (148)
type REJ struct {
	LocalCommID     uint32
	RemoteCommID    uint32
	MessageRejected uint8 // 2 bits: REJMsgREQ, REJMsgREP, REJMsgOther
	Reason          REJReason
	// ARI is the first ARI-length bytes of the ARI area (nil when the
	// length is 0); at most REJARILen bytes. Its meaning depends on
	// Reason (e.g. a GID for REJInvalidGID).
	ARI []byte
	// PrivateData is the whole REJPrivateLen-byte area after Parse.
	PrivateData []byte
}

const (
	rejMsgRejected = 8 // message rejected(2) reserved(6)
	rejARILength   = 9 // ARI length(7) reserved(1)
	rejReason      = 10
	rejARI         = 12
	rejPrivate     = 84
)

// REJARIArea returns the whole ARI area of a REJ's data bytes, all
// REJARILen of them whatever the ARI length says (nil when data is too
// short to be a REJ's): cm.c's cm_acquire_rejected_id reads a timeout
// REJ's CA GUID from the area's first 8 bytes without looking at the
// length, which ParseREJ's ARI honours.
func REJARIArea(data []byte) []byte {
	if len(data) < rejARI+REJARILen {
		return nil
	}
	return data[rejARI : rejARI+REJARILen]
}

// AttrID returns AttrREJ.
func (*REJ) AttrID() uint16 { return AttrREJ }

// ParseREJ decodes the DataLen data bytes of a REJ. An ARI length beyond
// the ARI area is ErrBadField.
func ParseREJ(data []byte) (*REJ, error) {
	if err := checkData("REJ", data); err != nil {
		return nil, err
	}
	d := data
	ariLen := int(d[rejARILength] >> 1)
	if ariLen > REJARILen {
		return nil, fmt.Errorf("%w: REJ ARI length %d exceeds %d", ErrBadField, ariLen, REJARILen)
	}
	m := &REJ{
		LocalCommID:     binary.BigEndian.Uint32(d[commLocalID:]),
		RemoteCommID:    binary.BigEndian.Uint32(d[commRemoteID:]),
		MessageRejected: d[rejMsgRejected] >> 6,
		Reason:          REJReason(binary.BigEndian.Uint16(d[rejReason:])),
		PrivateData:     cloneArea(d[rejPrivate : rejPrivate+REJPrivateLen]),
	}
	if ariLen > 0 {
		m.ARI = cloneArea(d[rejARI : rejARI+ariLen])
	}
	return m, nil
}

// Validate reports the fields of m that do not fit.
func (m *REJ) Validate() error {
	const n = "REJ"
	var ariErr error
	if len(m.ARI) > REJARILen {
		ariErr = fmt.Errorf("%w: REJ ARI of %d bytes, at most %d", ErrBadField, len(m.ARI), REJARILen)
	}
	return errors.Join(
		checkBits(n, "message rejected", uint32(m.MessageRejected), 2),
		ariErr,
		checkPrivate(n, m.PrivateData, REJPrivateLen),
	)
}

// AppendData appends the DataLen data bytes of m; it panics if
// m.Validate fails.
func (m *REJ) AppendData(b []byte) []byte {
	mustValid(m)
	b, d := growData(b)
	binary.BigEndian.PutUint32(d[commLocalID:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[commRemoteID:], m.RemoteCommID)
	d[rejMsgRejected] = m.MessageRejected << 6
	d[rejARILength] = uint8(len(m.ARI)) << 1
	binary.BigEndian.PutUint16(d[rejReason:], uint16(m.Reason))
	copy(d[rejARI:], m.ARI)
	copy(d[rejPrivate:], m.PrivateData)
	return b
}
