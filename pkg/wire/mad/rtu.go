package mad

import "encoding/binary"

// RTUPrivateLen is the size of an RTU's private data area.
const RTUPrivateLen = 224

// RTU is ReadyToUse (IBA 12.6.9), the active side's acknowledgement of a
// REP: 0: local comm ID | 4: remote comm ID | 8: private data (224).
type RTU struct {
	LocalCommID  uint32
	RemoteCommID uint32
	// PrivateData is the whole RTUPrivateLen-byte area after Parse.
	PrivateData []byte
}

const (
	commLocalID  = 0 // every connected-mode message starts with the two comm IDs
	commRemoteID = 4
	rtuPrivate   = 8
)

// AttrID returns AttrRTU.
func (*RTU) AttrID() uint16 { return AttrRTU }

// ParseRTU decodes the DataLen data bytes of an RTU.
func ParseRTU(data []byte) (*RTU, error) {
	if err := checkData("RTU", data); err != nil {
		return nil, err
	}
	return &RTU{
		LocalCommID:  binary.BigEndian.Uint32(data[commLocalID:]),
		RemoteCommID: binary.BigEndian.Uint32(data[commRemoteID:]),
		PrivateData:  cloneArea(data[rtuPrivate : rtuPrivate+RTUPrivateLen]),
	}, nil
}

// Validate reports an RTU private data area that is too long.
func (m *RTU) Validate() error { return checkPrivate("RTU", m.PrivateData, RTUPrivateLen) }

// AppendData appends the DataLen data bytes of m; it panics if
// m.Validate fails.
func (m *RTU) AppendData(b []byte) []byte {
	mustValid(m)
	b, d := growData(b)
	binary.BigEndian.PutUint32(d[commLocalID:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[commRemoteID:], m.RemoteCommID)
	copy(d[rtuPrivate:], m.PrivateData)
	return b
}
