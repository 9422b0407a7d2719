package mad

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// Path is one path (primary or alternate) of a REQ, 44 bytes:
//
//	0-1: local port LID | 2-3: remote port LID
//	4-19: local port GID | 20-35: remote port GID
//	36-39: flow label(20) reserved(6) packet rate(6)
//	40: traffic class | 41: hop limit
//	42: SL(4) subnet local(1) reserved(3) | 43: local ACK timeout(5) reserved(3)
//
// "Local" is the sender of the REQ. On RoCE the LIDs are 0xFFFF
// (permissive) and the GIDs are the endpoints' IP addresses.
type Path struct {
	LocalLID, RemoteLID uint16
	// LocalGID and RemoteGID are 16-byte GIDs: Parse returns IPv4 GIDs
	// as ::ffff:a.b.c.d; Append accepts a 4-byte address and maps it.
	LocalGID, RemoteGID netip.Addr
	FlowLabel           uint32 // 20 bits
	PacketRate          uint8  // 6 bits, IBA rate encoding (0: port current)
	TrafficClass        uint8
	HopLimit            uint8
	SL                  uint8 // 4 bits
	SubnetLocal         bool
	LocalACKTimeout     uint8 // 5 bits, IBA time value (see TimeoutDuration)
}

// noPath is what parsePath returns for an all-zero (absent) path.
var noPath = Path{LocalGID: netip.IPv6Unspecified(), RemoteGID: netip.IPv6Unspecified()}

// PathLen is the size of a REQ path.
const PathLen = 44

const (
	pathLocalLID     = 0
	pathRemoteLID    = 2
	pathLocalGID     = 4
	pathRemoteGID    = 20
	pathFlowLabel    = 36 // 32-bit word: flow label(20) reserved(6) packet rate(6)
	pathTrafficClass = 40
	pathHopLimit     = 41
	pathSL           = 42 // SL(4) subnet local(1) reserved(3)
	pathACKTimeout   = 43 // local ACK timeout(5) reserved(3)
)

func parsePath(b []byte) Path {
	w := binary.BigEndian.Uint32(b[pathFlowLabel:])
	return Path{
		LocalLID:        binary.BigEndian.Uint16(b[pathLocalLID:]),
		RemoteLID:       binary.BigEndian.Uint16(b[pathRemoteLID:]),
		LocalGID:        gidAt(b[pathLocalGID:]),
		RemoteGID:       gidAt(b[pathRemoteGID:]),
		FlowLabel:       w >> 12,
		PacketRate:      uint8(w & 0x3F),
		TrafficClass:    b[pathTrafficClass],
		HopLimit:        b[pathHopLimit],
		SL:              b[pathSL] >> 4,
		SubnetLocal:     b[pathSL]&0x08 != 0,
		LocalACKTimeout: b[pathACKTimeout] >> 3,
	}
}

// put writes p into the zeroed 44 bytes at b.
func (p *Path) put(b []byte) {
	binary.BigEndian.PutUint16(b[pathLocalLID:], p.LocalLID)
	binary.BigEndian.PutUint16(b[pathRemoteLID:], p.RemoteLID)
	putGID(b[pathLocalGID:], p.LocalGID)
	putGID(b[pathRemoteGID:], p.RemoteGID)
	binary.BigEndian.PutUint32(b[pathFlowLabel:], p.FlowLabel<<12|uint32(p.PacketRate))
	b[pathTrafficClass] = p.TrafficClass
	b[pathHopLimit] = p.HopLimit
	b[pathSL] = p.SL<<4 | b2u(p.SubnetLocal)<<3
	b[pathACKTimeout] = p.LocalACKTimeout << 3
}

// Validate reports the fields of p that do not fit.
func (p *Path) Validate() error {
	const m = "REQ path"
	return errors.Join(
		checkGID(m, "local GID", p.LocalGID),
		checkGID(m, "remote GID", p.RemoteGID),
		checkBits(m, "flow label", p.FlowLabel, 20),
		checkBits(m, "packet rate", uint32(p.PacketRate), 6),
		checkBits(m, "SL", uint32(p.SL), 4),
		checkBits(m, "local ACK timeout", uint32(p.LocalACKTimeout), 5),
	)
}
