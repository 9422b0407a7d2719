package mad

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
)

// PortSpace is an rdma_cm port space (enum rdma_ucm_port_space): the high
// 16 bits of the low 32 bits of an rdma_cm service ID.
type PortSpace uint16

// rdma_cm port spaces.
const (
	PortSpaceIPoIB PortSpace = 0x0002
	PortSpaceTCP   PortSpace = 0x0106 // RC and UC connections
	PortSpaceUDP   PortSpace = 0x0111 // UD, resolved by SIDR
	PortSpaceIB    PortSpace = 0x013F
)

// String names ps as rdma_cma.h does ("RDMA_PS_TCP", ...).
func (ps PortSpace) String() string {
	switch ps {
	case PortSpaceIPoIB:
		return "RDMA_PS_IPOIB"
	case PortSpaceTCP:
		return "RDMA_PS_TCP"
	case PortSpaceUDP:
		return "RDMA_PS_UDP"
	case PortSpaceIB:
		return "RDMA_PS_IB"
	}
	return "PortSpace(0x" + strconv.FormatUint(uint64(ps), 16) + ")"
}

// ServiceID returns rdma_cm's service ID for a port: ps << 16 | port
// (cma.c's rdma_get_service_id), e.g. 0x0000000001061C06 for TCP port 7174.
func ServiceID(ps PortSpace, port uint16) uint64 { return uint64(ps)<<16 | uint64(port) }

// SplitServiceID undoes ServiceID. ok is false for an ID that is not an
// rdma_cm one: bits above 32 set, or an unknown port space.
func SplitServiceID(id uint64) (ps PortSpace, port uint16, ok bool) {
	ps, port = PortSpace(id>>16), uint16(id)
	switch {
	case id>>32 != 0:
		return ps, port, false
	case ps == PortSpaceIPoIB, ps == PortSpaceTCP, ps == PortSpaceUDP, ps == PortSpaceIB:
		return ps, port, true
	}
	return ps, port, false
}

// CMAHeaderLen is the size of rdma_cm's header at the start of REQ and
// SIDR_REQ private data (struct cma_hdr).
const CMAHeaderLen = 36

// CMAVersion is the only rdma_cm header version (CMA_VERSION).
const CMAVersion = 0x00

// CMAHeader is rdma_cm's IP addressing header, at the start of the private
// data of REQ and SIDR_REQ (not REP, REJ or SIDR_REP):
//
//	0: cma_version | 1: IP version(4) reserved(4) | 2-3: source port
//	4-19: source address | 20-35: destination address
//
// An IPv4 address sits in the last 4 of its 16 bytes after 12 zero bytes
// (union cma_ip_addr), not in the ::ffff: form GIDs use. Src and SrcPort
// are the active side's; Dst is the address the passive side listens on
// (its port is in the service ID).
type CMAHeader struct {
	CMAVersion uint8 // 0
	IPVersion  uint8 // 4 or 6
	SrcPort    uint16
	// Src and Dst are 4-byte addresses for IPVersion 4 and 16-byte ones
	// for IPVersion 6 (Parse returns them so; Append unmaps an
	// IPv4-mapped address given for IPVersion 4).
	Src, Dst netip.Addr
}

const (
	cmaVersion   = 0
	cmaIPVersion = 1 // IP version << 4
	cmaPort      = 2
	cmaSrcAddr   = 4
	cmaDstAddr   = 20
	cmaIPv4In16  = 12 // offset of an IPv4 address in its 16-byte slot
)

// ParseCMAHeader decodes the header at the start of pd (REQ or SIDR_REQ
// private data; anything after the first CMAHeaderLen bytes is the
// application's). A version other than 0 is ErrBadVersion, an IP version
// other than 4 or 6 ErrBadField, as cma.c refuses them. The pad bytes
// before an IPv4 address are ignored.
func ParseCMAHeader(pd []byte) (CMAHeader, error) {
	if len(pd) < CMAHeaderLen {
		return CMAHeader{}, fmt.Errorf("%w: rdma_cm header of %d bytes, want %d", ErrTruncated, len(pd), CMAHeaderLen)
	}
	h := CMAHeader{
		CMAVersion: pd[cmaVersion],
		IPVersion:  pd[cmaIPVersion] >> 4,
		SrcPort:    binary.BigEndian.Uint16(pd[cmaPort:]),
	}
	if h.CMAVersion != CMAVersion {
		return h, fmt.Errorf("%w: rdma_cm header version %d, want %d", ErrBadVersion, h.CMAVersion, CMAVersion)
	}
	switch h.IPVersion {
	case 4:
		h.Src = netip.AddrFrom4([4]byte(pd[cmaSrcAddr+cmaIPv4In16:]))
		h.Dst = netip.AddrFrom4([4]byte(pd[cmaDstAddr+cmaIPv4In16:]))
	case 6:
		h.Src = netip.AddrFrom16([16]byte(pd[cmaSrcAddr:]))
		h.Dst = netip.AddrFrom16([16]byte(pd[cmaDstAddr:]))
	default:
		return h, fmt.Errorf("%w: rdma_cm header IP version %d, want 4 or 6", ErrBadField, h.IPVersion)
	}
	return h, nil
}

// Validate reports a header Append cannot encode: a version other than
// 0, an IP version other than 4 or 6, or addresses not of that version.
func (h CMAHeader) Validate() error {
	if h.CMAVersion != CMAVersion {
		return fmt.Errorf("%w: rdma_cm header version %d, want %d", ErrBadVersion, h.CMAVersion, CMAVersion)
	}
	for _, a := range [2]struct {
		name string
		addr netip.Addr
	}{{"source", h.Src}, {"destination", h.Dst}} {
		switch {
		case !a.addr.IsValid():
			return fmt.Errorf("%w: rdma_cm header %s address not set", ErrBadField, a.name)
		case h.IPVersion == 4 && !a.addr.Unmap().Is4():
			return fmt.Errorf("%w: rdma_cm header %s address %v is not IPv4", ErrBadField, a.name, a.addr)
		case h.IPVersion == 6 && !a.addr.Is6():
			return fmt.Errorf("%w: rdma_cm header %s address %v is not IPv6", ErrBadField, a.name, a.addr)
		case h.IPVersion != 4 && h.IPVersion != 6:
			return fmt.Errorf("%w: rdma_cm header IP version %d, want 4 or 6", ErrBadField, h.IPVersion)
		}
	}
	return nil
}

// Append appends the CMAHeaderLen-byte encoding of h, reserved and pad
// bytes zero. It panics if h.Validate fails.
func (h CMAHeader) Append(b []byte) []byte {
	if err := h.Validate(); err != nil {
		panic(err)
	}
	n := len(b)
	b = slices.Grow(b, CMAHeaderLen)[:n+CMAHeaderLen]
	d := b[n:]
	clear(d)
	d[cmaVersion] = h.CMAVersion
	d[cmaIPVersion] = h.IPVersion << 4
	binary.BigEndian.PutUint16(d[cmaPort:], h.SrcPort)
	putCMAAddr(d[cmaSrcAddr:], h.IPVersion, h.Src)
	putCMAAddr(d[cmaDstAddr:], h.IPVersion, h.Dst)
	return b
}

func putCMAAddr(b []byte, ipVersion uint8, a netip.Addr) {
	if ipVersion == 4 {
		v4 := a.Unmap().As4()
		copy(b[cmaIPv4In16:], v4[:])
		return
	}
	v6 := a.As16()
	copy(b, v6[:])
}
