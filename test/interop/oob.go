//go:build linux

package interop

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// PingpongDestLen is the size of one ibv_*_pingpong out-of-band message:
// "LLLL:QQQQQQ:PPPPPP:GGGG...G" (lid, QPN, PSN in hex, GID as 32 hex digits) and a NUL.
const PingpongDestLen = len("0000:000000:000000:00000000000000000000000000000000") + 1

// PingpongDest is what each side of ibv_*_pingpong tells the other over TCP.
type PingpongDest struct {
	LID, QPN, PSN uint32
	GID           netip.Addr // 16-byte form (IPv4 GIDs are IPv4-mapped)
}

// Marshal renders d exactly as rdma-core's pingpong examples write it.
func (d PingpongDest) Marshal() []byte {
	g := d.GID.As16()
	s := fmt.Sprintf("%04x:%06x:%06x:%s", d.LID&0xffff, d.QPN&0xffffff, d.PSN&0xffffff, hex.EncodeToString(g[:]))
	return append([]byte(s), 0)
}

// ParsePingpongDest parses one out-of-band message (with or without the trailing NUL).
func ParsePingpongDest(b []byte) (PingpongDest, error) {
	var d PingpongDest
	s := strings.TrimRight(string(b), "\x00")
	f := strings.Split(s, ":")
	if len(f) != 4 || len(f[0]) != 4 || len(f[1]) != 6 || len(f[2]) != 6 || len(f[3]) != 32 {
		return d, fmt.Errorf("pingpong dest %q: want LLLL:QQQQQQ:PPPPPP:<32 hex>", s)
	}
	var v [3]uint64
	for i := range v {
		x, err := strconv.ParseUint(f[i], 16, 32)
		if err != nil {
			return d, fmt.Errorf("pingpong dest %q: %w", s, err)
		}
		v[i] = x
	}
	raw, err := hex.DecodeString(f[3])
	if err != nil {
		return d, fmt.Errorf("pingpong dest %q: %w", s, err)
	}
	d.LID, d.QPN, d.PSN = uint32(v[0]), uint32(v[1]), uint32(v[2])
	d.GID = netip.AddrFrom16([16]byte(raw))
	return d, nil
}

// BTHInfo is the part of a RoCEv2 Base Transport Header the smoke test looks at.
type BTHInfo struct {
	Opcode  uint8
	DestQPN uint32
	PSN     uint32
	AckReq  bool
}

// ErrShortBTH: a UDP payload too short to hold a BTH and an ICRC.
var ErrShortBTH = errors.New("RoCEv2 payload shorter than BTH+ICRC")

// ParseBTH decodes the BTH at the start of a UDP 4791 payload.
func ParseBTH(p []byte) (BTHInfo, error) {
	if len(p) < 12+4 {
		return BTHInfo{}, ErrShortBTH
	}
	return BTHInfo{
		Opcode:  p[0],
		DestQPN: binary.BigEndian.Uint32(p[4:8]) & 0xffffff,
		AckReq:  p[8]&0x80 != 0,
		PSN:     binary.BigEndian.Uint32(p[8:12]) & 0xffffff,
	}, nil
}
