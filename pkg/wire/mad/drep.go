package mad

import "encoding/binary"

// DREPPrivateLen is the size of a DREP's private data area.
const DREPPrivateLen = 224

// DREP is DisconnectReply (IBA 12.6.11): 0: local comm ID | 4: remote comm
// ID | 8: private data (224).
type DREP struct {
	LocalCommID  uint32
	RemoteCommID uint32
	// PrivateData is the whole DREPPrivateLen-byte area after Parse.
	PrivateData []byte
}

const drepPrivate = 8

// AttrID returns AttrDREP.
func (*DREP) AttrID() uint16 { return AttrDREP }

// ParseDREP decodes the DataLen data bytes of a DREP.
func ParseDREP(data []byte) (*DREP, error) {
	if err := checkData("DREP", data); err != nil {
		return nil, err
	}
	return &DREP{
		LocalCommID:  binary.BigEndian.Uint32(data[commLocalID:]),
		RemoteCommID: binary.BigEndian.Uint32(data[commRemoteID:]),
		PrivateData:  cloneArea(data[drepPrivate : drepPrivate+DREPPrivateLen]),
	}, nil
}

// Validate reports a DREP private data area that is too long.
func (m *DREP) Validate() error { return checkPrivate("DREP", m.PrivateData, DREPPrivateLen) }

// AppendData appends the DataLen data bytes of m; it panics if
// m.Validate fails.
func (m *DREP) AppendData(b []byte) []byte {
	mustValid(m)
	b, d := growData(b)
	binary.BigEndian.PutUint32(d[commLocalID:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[commRemoteID:], m.RemoteCommID)
	copy(d[drepPrivate:], m.PrivateData)
	return b
}
