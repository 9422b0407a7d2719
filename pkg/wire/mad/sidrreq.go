package mad

import "encoding/binary"

// SIDRREQPrivateLen is the size of a SIDR_REQ's private data area.
// rdma_cm puts its CMAHeaderLen-byte header first.
const SIDRREQPrivateLen = 216

// SIDRREQ is ServiceIDResolutionRequest (IBA 12.11.1): a UD client asks
// which QPN and Q_Key serve ServiceID. Offsets in the data area:
//
//	0: request ID | 4: P_Key | 6: reserved | 8: service ID | 16: private data (216)
type SIDRREQ struct {
	RequestID uint32
	PKey      uint16
	ServiceID uint64
	// PrivateData is the whole SIDRREQPrivateLen-byte area after Parse.
	PrivateData []byte
}

const (
	sidrReqRequestID = 0
	sidrReqPKey      = 4
	sidrReqServiceID = 8
	sidrReqPrivate   = 16
)

// AttrID returns AttrSIDRREQ.
func (*SIDRREQ) AttrID() uint16 { return AttrSIDRREQ }

// ParseSIDRREQ decodes the DataLen data bytes of a SIDR_REQ.
func ParseSIDRREQ(data []byte) (*SIDRREQ, error) {
	if err := checkData("SIDR_REQ", data); err != nil {
		return nil, err
	}
	return &SIDRREQ{
		RequestID:   binary.BigEndian.Uint32(data[sidrReqRequestID:]),
		PKey:        binary.BigEndian.Uint16(data[sidrReqPKey:]),
		ServiceID:   binary.BigEndian.Uint64(data[sidrReqServiceID:]),
		PrivateData: cloneArea(data[sidrReqPrivate : sidrReqPrivate+SIDRREQPrivateLen]),
	}, nil
}

// Validate reports a SIDR_REQ private data area that is too long.
func (m *SIDRREQ) Validate() error {
	return checkPrivate("SIDR_REQ", m.PrivateData, SIDRREQPrivateLen)
}

// AppendData appends the DataLen data bytes of m; it panics if
// m.Validate fails.
func (m *SIDRREQ) AppendData(b []byte) []byte {
	mustValid(m)
	b, d := growData(b)
	binary.BigEndian.PutUint32(d[sidrReqRequestID:], m.RequestID)
	binary.BigEndian.PutUint16(d[sidrReqPKey:], m.PKey)
	binary.BigEndian.PutUint64(d[sidrReqServiceID:], m.ServiceID)
	copy(d[sidrReqPrivate:], m.PrivateData)
	return b
}
