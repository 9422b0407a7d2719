package mad

import (
	"encoding/binary"
	"errors"
)

// REPPrivateLen is the size of a REP's private data area.
const REPPrivateLen = 196

// REP is ConnectReply (IBA 12.6.8), the passive side's answer to a REQ.
// Offsets in the data area:
//
//	0: local comm ID | 4: remote comm ID | 8: local Q_Key
//	12: local QPN(24) vendor ID high(8) | 16: local EECN(24) vendor ID middle(8)
//	20: starting PSN(24) vendor ID low(8) | 24: responder resources | 25: initiator depth
//	26: target ACK delay(5) failover accepted(2) end-to-end flow control(1)
//	27: RNR retry count(3) SRQ(1) reserved(4) | 28: local CA GUID | 36: private data (196)
type REP struct {
	LocalCommID         uint32
	RemoteCommID        uint32
	LocalQKey           uint32
	LocalQPN            uint32 // 24 bits
	LocalEECN           uint32 // 24 bits, RD only
	StartingPSN         uint32 // 24 bits
	ResponderResources  uint8
	InitiatorDepth      uint8
	TargetACKDelay      uint8 // 5 bits
	FailoverAccepted    uint8 // 2 bits
	EndToEndFlowControl bool
	RNRRetryCount       uint8 // 3 bits
	SRQ                 bool
	LocalCAGUID         uint64
	// VendorID (24 bits) is an IBA 1.4 addition, spread over the bytes
	// after LocalQPN (high), LocalEECN (middle) and StartingPSN (low).
	VendorID uint32
	// PrivateData is the whole REPPrivateLen-byte area after Parse; at
	// most REPPrivateLen bytes, zero-padded, on Append.
	PrivateData []byte
}

const (
	repLocalCommID   = 0
	repRemoteCommID  = 4
	repLocalQKey     = 8
	repLocalQPN      = 12
	repVendorIDH     = 15
	repLocalEECN     = 16
	repVendorIDM     = 19
	repStartingPSN   = 20
	repVendorIDL     = 23
	repRespResources = 24
	repInitDepth     = 25
	repTargetACK     = 26 // target ACK delay(5) failover accepted(2) flow control(1)
	repRNRRetry      = 27 // RNR retry count(3) SRQ(1) reserved(4)
	repLocalCAGUID   = 28
	repPrivateData   = 36
)

// AttrID returns AttrREP.
func (*REP) AttrID() uint16 { return AttrREP }

// ParseREP decodes the DataLen data bytes of a REP.
func ParseREP(data []byte) (*REP, error) {
	if err := checkData("REP", data); err != nil {
		return nil, err
	}
	d := data
	return &REP{
		LocalCommID:         binary.BigEndian.Uint32(d[repLocalCommID:]),
		RemoteCommID:        binary.BigEndian.Uint32(d[repRemoteCommID:]),
		LocalQKey:           binary.BigEndian.Uint32(d[repLocalQKey:]),
		LocalQPN:            be24(d[repLocalQPN:]),
		LocalEECN:           be24(d[repLocalEECN:]),
		StartingPSN:         be24(d[repStartingPSN:]),
		ResponderResources:  d[repRespResources],
		InitiatorDepth:      d[repInitDepth],
		TargetACKDelay:      d[repTargetACK] >> 3,
		FailoverAccepted:    d[repTargetACK] >> 1 & 0x3,
		EndToEndFlowControl: d[repTargetACK]&0x1 != 0,
		RNRRetryCount:       d[repRNRRetry] >> 5,
		SRQ:                 d[repRNRRetry]&0x10 != 0,
		LocalCAGUID:         binary.BigEndian.Uint64(d[repLocalCAGUID:]),
		VendorID:            uint32(d[repVendorIDH])<<16 | uint32(d[repVendorIDM])<<8 | uint32(d[repVendorIDL]),
		PrivateData:         cloneArea(d[repPrivateData : repPrivateData+REPPrivateLen]),
	}, nil
}

// Validate reports the fields of m that do not fit.
func (m *REP) Validate() error {
	const n = "REP"
	return errors.Join(
		checkBits(n, "vendor ID", m.VendorID, 24),
		checkBits(n, "local QPN", m.LocalQPN, 24),
		checkBits(n, "local EECN", m.LocalEECN, 24),
		checkBits(n, "starting PSN", m.StartingPSN, 24),
		checkBits(n, "target ACK delay", uint32(m.TargetACKDelay), 5),
		checkBits(n, "failover accepted", uint32(m.FailoverAccepted), 2),
		checkBits(n, "RNR retry count", uint32(m.RNRRetryCount), 3),
		checkPrivate(n, m.PrivateData, REPPrivateLen),
	)
}

// AppendData appends the DataLen data bytes of m; it panics if
// m.Validate fails.
func (m *REP) AppendData(b []byte) []byte {
	mustValid(m)
	b, d := growData(b)
	binary.BigEndian.PutUint32(d[repLocalCommID:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[repRemoteCommID:], m.RemoteCommID)
	binary.BigEndian.PutUint32(d[repLocalQKey:], m.LocalQKey)
	put24(d[repLocalQPN:], m.LocalQPN)
	put24(d[repLocalEECN:], m.LocalEECN)
	put24(d[repStartingPSN:], m.StartingPSN)
	d[repVendorIDH], d[repVendorIDM], d[repVendorIDL] = byte(m.VendorID>>16), byte(m.VendorID>>8), byte(m.VendorID)
	d[repRespResources] = m.ResponderResources
	d[repInitDepth] = m.InitiatorDepth
	d[repTargetACK] = m.TargetACKDelay<<3 | m.FailoverAccepted<<1 | b2u(m.EndToEndFlowControl)
	d[repRNRRetry] = m.RNRRetryCount<<5 | b2u(m.SRQ)<<4
	binary.BigEndian.PutUint64(d[repLocalCAGUID:], m.LocalCAGUID)
	copy(d[repPrivateData:], m.PrivateData)
	return b
}
