package wire

// Wire lengths of the RoCEv2 transport headers, in bytes.
const (
	BTHLen          = 12
	RETHLen         = 16
	AETHLen         = 4
	AtomicETHLen    = 28
	AtomicAckETHLen = 8
	DETHLen         = 8
	ImmDtLen        = 4
	IETHLen         = 4
	FETHLen         = 4
	CNPLen          = 16 // the reserved block after a CNP's BTH
	RDETHLen        = 4  // RD only (unsupported)
	XRCETHLen       = 4  // XRC only (unsupported)
	ICRCLen         = 4

	// UDPPort is the IANA RoCEv2 destination port.
	UDPPort = 4791
)

// be24 and putBE24 handle the 24-bit big-endian fields (QPNs, PSNs, MSNs).
func be24(b []byte) uint32 {
	_ = b[2]
	return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2])
}

func putBE24(b []byte, v uint32) {
	_ = b[2]
	b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v)
}
