package mad

import (
	"encoding/binary"
	"errors"
)

// REQPrivateLen is the size of a REQ's private data area. rdma_cm puts its
// CMAHeaderLen-byte header first, leaving 56 bytes to the application.
const REQPrivateLen = 92

// Transport service types of REQ.TransportType.
const (
	TransportRC  = 0
	TransportUC  = 1
	TransportRD  = 2
	TransportXRC = 3
)

// REQ is ConnectRequest (IBA 12.6.5), sent by the active side. Offsets in
// the data area (bit fields MSB first):
//
//	0: local comm ID | 4: reserved(8) vendor ID(24) | 8: service ID | 16: local CA GUID
//	24: reserved | 28: local Q_Key | 32: local QPN(24) | 35: responder resources
//	36: local EECN(24) | 39: initiator depth | 40: remote EECN(24)
//	43: remote CM response timeout(5) transport type(2) end-to-end flow control(1)
//	44: starting PSN(24) | 47: local CM response timeout(5) retry count(3)
//	48: P_Key | 50: path MTU(4) RDC exists(1) RNR retry count(3)
//	51: max CM retries(4) SRQ(1) extended transport type(3)
//	52: primary path (44) | 96: alternate path (44), whose last byte also holds
//	SAP supported (bit 2) | 140: private data (92)
type REQ struct {
	LocalCommID             uint32
	ServiceID               uint64
	LocalCAGUID             uint64
	LocalQKey               uint32
	LocalQPN                uint32 // 24 bits
	ResponderResources      uint8
	InitiatorDepth          uint8
	RemoteCMResponseTimeout uint8 // 5 bits
	TransportType           uint8 // 2 bits: TransportRC, TransportUC, TransportXRC
	EndToEndFlowControl     bool
	StartingPSN             uint32 // 24 bits
	LocalCMResponseTimeout  uint8  // 5 bits
	RetryCount              uint8  // 3 bits
	PKey                    uint16
	PathMTU                 uint8 // 4 bits, IBA MTU encoding (1: 256 ... 5: 4096)
	RDCExists               bool
	RNRRetryCount           uint8 // 3 bits
	MaxCMRetries            uint8 // 4 bits
	SRQ                     bool
	ExtendedTransport       uint8 // 3 bits
	Primary                 Path
	// Alternate is nil when the REQ carries no alternate path (all 44
	// bytes zero but SAP supported, as rdma_cm always sends).
	Alternate *Path
	// PrivateData is the whole REQPrivateLen-byte area after Parse; at
	// most REQPrivateLen bytes, zero-padded, on Append.
	PrivateData []byte
	// LocalEECN and RemoteEECN are for RD only (zero otherwise); 24 bits.
	LocalEECN, RemoteEECN uint32
	// VendorID (24 bits) and SAPSupported are IBA 1.4 additions (Linux
	// sends a vendor ID for Enhanced Connection Establishment only).
	VendorID     uint32
	SAPSupported bool
}

const (
	reqLocalCommID   = 0
	reqVendorID      = 5
	reqServiceID     = 8
	reqLocalCAGUID   = 16
	reqLocalQKey     = 28
	reqLocalQPN      = 32
	reqRespResources = 35
	reqLocalEECN     = 36
	reqInitDepth     = 39
	reqRemoteEECN    = 40
	reqRemoteTimeout = 43 // remote CM response timeout(5) transport type(2) flow control(1)
	reqStartingPSN   = 44
	reqLocalTimeout  = 47 // local CM response timeout(5) retry count(3)
	reqPKey          = 48
	reqPathMTU       = 50 // path MTU(4) RDC exists(1) RNR retry count(3)
	reqMaxCMRetries  = 51 // max CM retries(4) SRQ(1) extended transport type(3)
	reqPrimaryPath   = 52
	reqAlternatePath = 96
	reqSAPSupported  = 139 // alternate local ACK timeout(5) SAP supported(1) reserved(2)
	reqPrivateData   = 140
)

// AttrID returns AttrREQ.
func (*REQ) AttrID() uint16 { return AttrREQ }

// ParseREQ decodes the DataLen data bytes of a REQ.
func ParseREQ(data []byte) (*REQ, error) {
	if err := checkData("REQ", data); err != nil {
		return nil, err
	}
	d := data
	m := &REQ{
		LocalCommID:             binary.BigEndian.Uint32(d[reqLocalCommID:]),
		VendorID:                be24(d[reqVendorID:]),
		ServiceID:               binary.BigEndian.Uint64(d[reqServiceID:]),
		LocalCAGUID:             binary.BigEndian.Uint64(d[reqLocalCAGUID:]),
		LocalQKey:               binary.BigEndian.Uint32(d[reqLocalQKey:]),
		LocalQPN:                be24(d[reqLocalQPN:]),
		ResponderResources:      d[reqRespResources],
		LocalEECN:               be24(d[reqLocalEECN:]),
		InitiatorDepth:          d[reqInitDepth],
		RemoteEECN:              be24(d[reqRemoteEECN:]),
		RemoteCMResponseTimeout: d[reqRemoteTimeout] >> 3,
		TransportType:           d[reqRemoteTimeout] >> 1 & 0x3,
		EndToEndFlowControl:     d[reqRemoteTimeout]&0x1 != 0,
		StartingPSN:             be24(d[reqStartingPSN:]),
		LocalCMResponseTimeout:  d[reqLocalTimeout] >> 3,
		RetryCount:              d[reqLocalTimeout] & 0x7,
		PKey:                    binary.BigEndian.Uint16(d[reqPKey:]),
		PathMTU:                 d[reqPathMTU] >> 4,
		RDCExists:               d[reqPathMTU]&0x08 != 0,
		RNRRetryCount:           d[reqPathMTU] & 0x7,
		MaxCMRetries:            d[reqMaxCMRetries] >> 4,
		SRQ:                     d[reqMaxCMRetries]&0x08 != 0,
		ExtendedTransport:       d[reqMaxCMRetries] & 0x7,
		Primary:                 parsePath(d[reqPrimaryPath:]),
		SAPSupported:            d[reqSAPSupported]&0x04 != 0,
		PrivateData:             cloneArea(d[reqPrivateData : reqPrivateData+REQPrivateLen]),
	}
	if alt := parsePath(d[reqAlternatePath:]); alt != noPath {
		m.Alternate = &alt
	}
	return m, nil
}

// Validate reports the fields of m that do not fit.
func (m *REQ) Validate() error {
	const n = "REQ"
	err := errors.Join(
		checkBits(n, "vendor ID", m.VendorID, 24),
		checkBits(n, "local QPN", m.LocalQPN, 24),
		checkBits(n, "local EECN", m.LocalEECN, 24),
		checkBits(n, "remote EECN", m.RemoteEECN, 24),
		checkBits(n, "remote CM response timeout", uint32(m.RemoteCMResponseTimeout), 5),
		checkBits(n, "transport type", uint32(m.TransportType), 2),
		checkBits(n, "starting PSN", m.StartingPSN, 24),
		checkBits(n, "local CM response timeout", uint32(m.LocalCMResponseTimeout), 5),
		checkBits(n, "retry count", uint32(m.RetryCount), 3),
		checkBits(n, "path MTU", uint32(m.PathMTU), 4),
		checkBits(n, "RNR retry count", uint32(m.RNRRetryCount), 3),
		checkBits(n, "max CM retries", uint32(m.MaxCMRetries), 4),
		checkBits(n, "extended transport type", uint32(m.ExtendedTransport), 3),
		checkPrivate(n, m.PrivateData, REQPrivateLen),
		m.Primary.Validate(),
	)
	if err == nil && m.Alternate != nil {
		err = m.Alternate.Validate()
	}
	return err
}

// AppendData appends the DataLen data bytes of m; it panics if
// m.Validate fails.
func (m *REQ) AppendData(b []byte) []byte {
	mustValid(m)
	b, d := growData(b)
	binary.BigEndian.PutUint32(d[reqLocalCommID:], m.LocalCommID)
	put24(d[reqVendorID:], m.VendorID)
	binary.BigEndian.PutUint64(d[reqServiceID:], m.ServiceID)
	binary.BigEndian.PutUint64(d[reqLocalCAGUID:], m.LocalCAGUID)
	binary.BigEndian.PutUint32(d[reqLocalQKey:], m.LocalQKey)
	put24(d[reqLocalQPN:], m.LocalQPN)
	d[reqRespResources] = m.ResponderResources
	put24(d[reqLocalEECN:], m.LocalEECN)
	d[reqInitDepth] = m.InitiatorDepth
	put24(d[reqRemoteEECN:], m.RemoteEECN)
	d[reqRemoteTimeout] = m.RemoteCMResponseTimeout<<3 | m.TransportType<<1 | b2u(m.EndToEndFlowControl)
	put24(d[reqStartingPSN:], m.StartingPSN)
	d[reqLocalTimeout] = m.LocalCMResponseTimeout<<3 | m.RetryCount
	binary.BigEndian.PutUint16(d[reqPKey:], m.PKey)
	d[reqPathMTU] = m.PathMTU<<4 | b2u(m.RDCExists)<<3 | m.RNRRetryCount
	d[reqMaxCMRetries] = m.MaxCMRetries<<4 | b2u(m.SRQ)<<3 | m.ExtendedTransport
	m.Primary.put(d[reqPrimaryPath:])
	if m.Alternate != nil {
		m.Alternate.put(d[reqAlternatePath:])
	}
	d[reqSAPSupported] |= b2u(m.SAPSupported) << 2
	copy(d[reqPrivateData:], m.PrivateData)
	return b
}
