package oob

import (
	"errors"
	"fmt"
)

// PingpongMsgLen is the size of the address message of ibv_*_pingpong:
// sizeof "0000:000000:000000:00000000000000000000000000000000", i.e. 51
// characters and the NUL, sent including the NUL.
const PingpongMsgLen = 52

// Offsets of the fields of the pingpong address message
// ("%04x:%06x:%06x:%s" with the GID as 32 hex digits).
const (
	ppLIDOff = 0
	ppQPNOff = 5
	ppPSNOff = 12
	ppGIDOff = 19
	ppNULOff = 51
)

// PingpongDoneMsg is what the pingpong client sends once it has the
// server's address: "done" and its NUL (5 bytes).
var PingpongDoneMsg = [5]byte{'d', 'o', 'n', 'e', 0}

// PingpongDest is one side's address in the ibv_*_pingpong exchange
// (struct pingpong_dest of rdma-core's examples).
type PingpongDest struct {
	LID uint16 // 0 on RoCE
	QPN uint32 // 24 bits
	PSN uint32 // 24 bits: the sender's initial send PSN, the receiver's rq_psn
	GID [16]byte
}

var errField24 = errors.New("does not fit in 24 bits")

// Encode writes the 52-byte message into b[:PingpongMsgLen]: lower-case hex,
// the GID as its 16 bytes in wire order, and the terminating NUL.
func (d PingpongDest) Encode(b []byte) error {
	if len(b) < PingpongMsgLen {
		return fmt.Errorf("oob: pingpong address needs %d bytes, buffer has %d", PingpongMsgLen, len(b))
	}
	if d.QPN > 0xffffff {
		return fmt.Errorf("oob: pingpong QPN %#x %w", d.QPN, errField24)
	}
	if d.PSN > 0xffffff {
		return fmt.Errorf("oob: pingpong PSN %#x %w", d.PSN, errField24)
	}
	b = b[:PingpongMsgLen]
	putHex(b[ppLIDOff:ppLIDOff+4], uint64(d.LID))
	b[ppLIDOff+4] = ':'
	putHex(b[ppQPNOff:ppQPNOff+6], uint64(d.QPN))
	b[ppQPNOff+6] = ':'
	putHex(b[ppPSNOff:ppPSNOff+6], uint64(d.PSN))
	b[ppPSNOff+6] = ':'
	for i, g := range d.GID {
		b[ppGIDOff+2*i] = hexDigits[g>>4]
		b[ppGIDOff+2*i+1] = hexDigits[g&0xf]
	}
	b[ppNULOff] = 0
	return nil
}

// MarshalBinary returns the 52-byte message.
func (d PingpongDest) MarshalBinary() ([]byte, error) {
	b := make([]byte, PingpongMsgLen)
	if err := d.Encode(b); err != nil {
		return nil, err
	}
	return b, nil
}

// UnmarshalBinary parses a 52-byte message (see ParsePingpongDest).
func (d *PingpongDest) UnmarshalBinary(b []byte) error {
	v, err := ParsePingpongDest(b)
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// ParsePingpongDest parses exactly one 52-byte address message. It is strict
// about the layout every rdma-core version sends (fixed-width fields, ':'
// separators, NUL at the end) and accepts either case of hex digits, as the
// tools' sscanf("%x") does.
func ParsePingpongDest(b []byte) (PingpongDest, error) {
	var d PingpongDest
	if len(b) != PingpongMsgLen {
		return d, fmt.Errorf("pingpong address is %d bytes, want %d", len(b), PingpongMsgLen)
	}
	for _, off := range [...]int{ppLIDOff + 4, ppQPNOff + 6, ppPSNOff + 6} {
		if b[off] != ':' {
			return d, fmt.Errorf("pingpong address: byte %d is %q, want ':'", off, b[off])
		}
	}
	if b[ppNULOff] != 0 {
		return d, fmt.Errorf("pingpong address: byte %d is %q, want NUL", ppNULOff, b[ppNULOff])
	}
	lid, ok := parseHexField(b[ppLIDOff : ppLIDOff+4])
	if !ok {
		return d, errors.New("pingpong address: LID is not hex")
	}
	qpn, ok := parseHexField(b[ppQPNOff : ppQPNOff+6])
	if !ok {
		return d, errors.New("pingpong address: QPN is not hex")
	}
	psn, ok := parseHexField(b[ppPSNOff : ppPSNOff+6])
	if !ok {
		return d, errors.New("pingpong address: PSN is not hex")
	}
	for i := range d.GID {
		hi, ok1 := hexVal(b[ppGIDOff+2*i])
		lo, ok2 := hexVal(b[ppGIDOff+2*i+1])
		if !ok1 || !ok2 {
			return d, errors.New("pingpong address: GID is not 32 hex digits")
		}
		d.GID[i] = hi<<4 | lo
	}
	d.LID, d.QPN, d.PSN = uint16(lid), uint32(qpn), uint32(psn)
	return d, nil
}
