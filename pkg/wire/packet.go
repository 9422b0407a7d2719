package wire

import (
	"encoding/binary"
	"errors"
)

// Parse errors, in the order Parse checks for them (rdma_rxe's rxe_rcv
// order). Test with errors.Is.
var (
	// ErrTruncated: shorter than a BTH, or than the opcode's headers plus
	// the ICRC.
	ErrTruncated = errors.New("wire: truncated packet")
	// ErrBadVersion: BTH TVer is not 0.
	ErrBadVersion = errors.New("wire: bad BTH transport version")
	// ErrBadOpcode: reserved opcode, or one rdma_rxe does not implement
	// (RD, XRC, manufacturer-specific).
	ErrBadOpcode = errors.New("wire: bad opcode")
	// ErrBadPadding: PadCnt larger than the payload area, non-zero on an
	// opcode without payload or on a FIRST/MIDDLE packet, or payload+pad
	// not a multiple of four bytes.
	ErrBadPadding = errors.New("wire: bad padding")
	// ErrBadLength: bytes between the headers and the ICRC on an opcode
	// that carries no payload.
	ErrBadLength = errors.New("wire: bad length")
)

// Packet is a parsed RoCEv2 UDP payload (BTH ... ICRC). Every slice in it
// aliases the buffer given to Parse; nothing is copied or allocated, so a
// Packet is only valid as long as that buffer is.
type Packet struct {
	Opcode Opcode
	Info   *OpInfo

	BTH          BTH
	RETH         RETH
	AETH         AETH
	AtomicETH    AtomicETH
	AtomicAckETH AtomicAckETH
	DETH         DETH
	ImmDt        ImmDt
	IETH         IETH
	FETH         FETH
	CNP          CNPBody

	// Payload excludes the pad bytes; Pad is the pad itself.
	Payload  []byte
	Pad      []byte
	PadCount int
	// ICRC is the received ICRC value (the wire bytes read little-endian).
	ICRC uint32
	// Raw is the whole buffer given to Parse.
	Raw []byte
}

// Reset clears p so that no header of a previous packet stays visible.
func (p *Packet) Reset() { *p = Packet{} }

// Parse parses b, the UDP payload of a RoCEv2 packet, into p. The checks
// follow rxe_rcv: length against BTH, length against the opcode's headers
// plus ICRC, TVer, opcode, then padding and length consistency. Parse does
// not check the ICRC (that needs the IP and UDP headers: see ICRC, Flow).
//
// Parse is strict where a lenient receiver might not be: a FIRST or MIDDLE
// packet with PadCnt != 0, and bytes after the headers of an opcode without
// payload, are errors (rdma_rxe never sends either).
//
// On error p still holds what could be parsed (at least Raw, and Opcode,
// Info and BTH once the BTH is complete); header views are nil.
func (p *Packet) Parse(b []byte) error {
	*p = Packet{Raw: b}
	if len(b) < BTHLen {
		return ErrTruncated
	}
	bth := BTH(b[:BTHLen:BTHLen])
	op := bth.Opcode()
	info := op.Info()
	p.Opcode, p.Info, p.BTH = op, info, bth

	need := BTHLen
	if info.Supported {
		need = info.HdrLen
	}
	if len(b) < need+ICRCLen {
		return ErrTruncated
	}
	if bth.TVer() != 0 {
		return ErrBadVersion
	}
	if !info.Supported {
		return ErrBadOpcode
	}
	icrcOff := len(b) - ICRCLen
	area := b[info.HdrLen:icrcOff] // payload + pad
	pad := bth.PadCount()
	if info.Flags&FlagPayload == 0 {
		if pad != 0 {
			return ErrBadPadding
		}
		if len(area) != 0 {
			return ErrBadLength
		}
	} else {
		if pad > len(area) || len(area)&3 != 0 {
			return ErrBadPadding
		}
		if pad != 0 && info.Flags&(FlagFirst|FlagMiddle) != 0 {
			return ErrBadPadding
		}
	}

	for k := 0; k < info.NHeaders; k++ {
		off := info.Offsets[k]
		h := info.Order[k]
		v := b[off : off+h.Len() : off+h.Len()]
		switch h {
		case HdrRETH:
			p.RETH = RETH(v)
		case HdrAETH:
			p.AETH = AETH(v)
		case HdrAtomicETH:
			p.AtomicETH = AtomicETH(v)
		case HdrAtomicAckETH:
			p.AtomicAckETH = AtomicAckETH(v)
		case HdrDETH:
			p.DETH = DETH(v)
		case HdrImmDt:
			p.ImmDt = ImmDt(v)
		case HdrIETH:
			p.IETH = IETH(v)
		case HdrFETH:
			p.FETH = FETH(v)
		case HdrCNP:
			p.CNP = CNPBody(v)
		}
	}
	plen := len(area) - pad
	p.Payload = area[:plen:plen]
	p.Pad = area[plen:]
	p.PadCount = pad
	p.ICRC = binary.LittleEndian.Uint32(b[icrcOff:])
	return nil
}

// HeaderBytes returns the BTH and extension headers of a parsed packet.
func (p *Packet) HeaderBytes() []byte { return p.Raw[:p.Info.HdrLen] }

// WithoutICRC returns Raw without the trailing ICRC: the bytes the ICRC
// covers after the IP and UDP headers.
func (p *Packet) WithoutICRC() []byte { return p.Raw[:len(p.Raw)-ICRCLen] }
