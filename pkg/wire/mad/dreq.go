package mad

import (
	"encoding/binary"
	"errors"
)

// DREQPrivateLen is the size of a DREQ's private data area.
const DREQPrivateLen = 220

// DREQ is DisconnectRequest (IBA 12.6.10): 0: local comm ID | 4: remote
// comm ID | 8: remote QPN/EECN(24) reserved(8) | 12: private data (220).
// RemoteQPN is the receiver's QPN, which cm.c checks against the
// connection.
type DREQ struct {
	LocalCommID  uint32
	RemoteCommID uint32
	RemoteQPN    uint32 // 24 bits
	// PrivateData is the whole DREQPrivateLen-byte area after Parse.
	PrivateData []byte
}

const (
	dreqRemoteQPN = 8
	dreqPrivate   = 12
)

// AttrID returns AttrDREQ.
func (*DREQ) AttrID() uint16 { return AttrDREQ }

// ParseDREQ decodes the DataLen data bytes of a DREQ.
func ParseDREQ(data []byte) (*DREQ, error) {
	if err := checkData("DREQ", data); err != nil {
		return nil, err
	}
	return &DREQ{
		LocalCommID:  binary.BigEndian.Uint32(data[commLocalID:]),
		RemoteCommID: binary.BigEndian.Uint32(data[commRemoteID:]),
		RemoteQPN:    be24(data[dreqRemoteQPN:]),
		PrivateData:  cloneArea(data[dreqPrivate : dreqPrivate+DREQPrivateLen]),
	}, nil
}

// Validate reports the fields of m that do not fit.
func (m *DREQ) Validate() error {
	return errors.Join(
		checkBits("DREQ", "remote QPN", m.RemoteQPN, 24),
		checkPrivate("DREQ", m.PrivateData, DREQPrivateLen),
	)
}

// AppendData appends the DataLen data bytes of m; it panics if
// m.Validate fails.
func (m *DREQ) AppendData(b []byte) []byte {
	mustValid(m)
	b, d := growData(b)
	binary.BigEndian.PutUint32(d[commLocalID:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[commRemoteID:], m.RemoteCommID)
	put24(d[dreqRemoteQPN:], m.RemoteQPN)
	copy(d[dreqPrivate:], m.PrivateData)
	return b
}
