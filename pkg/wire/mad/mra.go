package mad

import (
	"encoding/binary"
	"errors"
)

// MRAPrivateLen is the size of an MRA's private data area.
const MRAPrivateLen = 222

// Values of MRA.MessageMRAed: which message the MRA acknowledges.
const (
	MRAMsgREQ = 0
	MRAMsgREP = 1
	MRAMsgLAP = 2
)

// MRA is MessageReceiptAcknowledgement (IBA 12.6.6): "I got your message
// and will answer within ServiceTimeout", which stops the sender's
// retransmissions. Offsets in the data area:
//
//	0: local comm ID | 4: remote comm ID | 8: message MRAed(2) reserved(6)
//	9: service timeout(5) reserved(3) | 10: private data (222)
type MRA struct {
	LocalCommID    uint32
	RemoteCommID   uint32
	MessageMRAed   uint8 // 2 bits: MRAMsgREQ, MRAMsgREP, MRAMsgLAP
	ServiceTimeout uint8 // 5 bits, IBA time value (see TimeoutDuration)
	// PrivateData is the whole MRAPrivateLen-byte area after Parse.
	PrivateData []byte
}

const (
	mraMsgMRAed       = 8  // message MRAed(2) reserved(6)
	mraServiceTimeout = 9  // service timeout(5) reserved(3)
	mraPrivate        = 10 // private data
)

// AttrID returns AttrMRA.
func (*MRA) AttrID() uint16 { return AttrMRA }

// ParseMRA decodes the DataLen data bytes of an MRA.
func ParseMRA(data []byte) (*MRA, error) {
	if err := checkData("MRA", data); err != nil {
		return nil, err
	}
	return &MRA{
		LocalCommID:    binary.BigEndian.Uint32(data[commLocalID:]),
		RemoteCommID:   binary.BigEndian.Uint32(data[commRemoteID:]),
		MessageMRAed:   data[mraMsgMRAed] >> 6,
		ServiceTimeout: data[mraServiceTimeout] >> 3,
		PrivateData:    cloneArea(data[mraPrivate : mraPrivate+MRAPrivateLen]),
	}, nil
}

// Validate reports the fields of m that do not fit.
func (m *MRA) Validate() error {
	const n = "MRA"
	return errors.Join(
		checkBits(n, "message MRAed", uint32(m.MessageMRAed), 2),
		checkBits(n, "service timeout", uint32(m.ServiceTimeout), 5),
		checkPrivate(n, m.PrivateData, MRAPrivateLen),
	)
}

// AppendData appends the DataLen data bytes of m; it panics if
// m.Validate fails.
func (m *MRA) AppendData(b []byte) []byte {
	mustValid(m)
	b, d := growData(b)
	binary.BigEndian.PutUint32(d[commLocalID:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[commRemoteID:], m.RemoteCommID)
	d[mraMsgMRAed] = m.MessageMRAed << 6
	d[mraServiceTimeout] = m.ServiceTimeout << 3
	copy(d[mraPrivate:], m.PrivateData)
	return b
}
