package wire

import "errors"

// ErrShortBuffer is returned by Headers.Encode when the destination is
// smaller than Headers.Len.
var ErrShortBuffer = errors.New("wire: buffer too short")

// Headers holds every field of every header a supported opcode can carry,
// as plain values; Encode writes only those the opcode uses. The zero
// value plus Opcode, PKey, DestQP and PSN is a valid packet description.
type Headers struct {
	// BTH
	Opcode Opcode
	SE     bool
	M      bool
	PKey   uint16
	FECN   bool
	BECN   bool
	DestQP uint32
	AckReq bool
	PSN    uint32

	// RETH, and VA/RKey of the AtomicETH
	VA     uint64
	RKey   uint32
	DMALen uint32

	// AtomicETH
	SwapAdd uint64
	Compare uint64

	// AETH
	Syndrome Syndrome
	MSN      uint32

	// AtomicAckETH
	OrigData uint64

	// DETH
	QKey  uint32
	SrcQP uint32

	// ImmDt
	Imm uint32

	// IETH
	InvRKey uint32

	// FETH
	FlushPlacement   uint8
	FlushSelectivity uint8
}

// PadFor returns the pad count for a payload of n bytes.
func PadFor(n int) int { return -n & 3 }

// Len returns the total packet length (headers, payload, pad, ICRC) for a
// payload of payloadLen bytes, or 0 if the opcode is not supported.
func (h *Headers) Len(payloadLen int) int {
	info := h.Opcode.Info()
	if !info.Supported {
		return 0
	}
	return info.HdrLen + payloadLen + PadFor(payloadLen) + ICRCLen
}

// Encode writes the BTH, the extension headers, payload and pad into b and
// zeroes the four ICRC bytes (fill them with Flow.Seal or ICRC). It returns
// the total length. It does not allocate.
func (h *Headers) Encode(b []byte, payload []byte) (int, error) {
	off, n, err := h.EncodeHeaders(b, len(payload))
	if err != nil {
		return 0, err
	}
	copy(b[off:], payload)
	return n, nil
}

// EncodeHeaders is the zero-copy form of Encode: it writes the headers,
// zeroes the pad and ICRC, and returns the offset at which the caller
// writes the payloadLen payload bytes, and the total length.
func (h *Headers) EncodeHeaders(b []byte, payloadLen int) (payloadOff, n int, err error) {
	info := h.Opcode.Info()
	if !info.Supported {
		return 0, 0, ErrBadOpcode
	}
	if payloadLen < 0 || (payloadLen > 0 && info.Flags&FlagPayload == 0) {
		return 0, 0, ErrBadLength
	}
	pad := PadFor(payloadLen)
	n = info.HdrLen + payloadLen + pad + ICRCLen
	if len(b) < n {
		return 0, 0, ErrShortBuffer
	}
	b = b[:n]
	bth := BTH(b[:BTHLen])
	bth[bthOpcode] = byte(h.Opcode)
	bth[bthFlags] = byte(pad) << 4
	bth.SetSE(h.SE)
	bth.SetM(h.M)
	bth.SetPKey(h.PKey)
	bth[bthFECN] = 0
	bth.SetFECN(h.FECN)
	bth.SetBECN(h.BECN)
	bth.SetDestQP(h.DestQP)
	bth[bthAckReq] = 0
	bth.SetAckReq(h.AckReq)
	bth.SetPSN(h.PSN)
	for k := 0; k < info.NHeaders; k++ {
		off := info.Offsets[k]
		switch info.Order[k] {
		case HdrRETH:
			v := RETH(b[off:])
			v.SetVA(h.VA)
			v.SetRKey(h.RKey)
			v.SetDMALen(h.DMALen)
		case HdrAETH:
			v := AETH(b[off:])
			v.SetSyndrome(h.Syndrome)
			v.SetMSN(h.MSN)
		case HdrAtomicETH:
			v := AtomicETH(b[off:])
			v.SetVA(h.VA)
			v.SetRKey(h.RKey)
			v.SetSwapAdd(h.SwapAdd)
			v.SetCompare(h.Compare)
		case HdrAtomicAckETH:
			AtomicAckETH(b[off:]).SetOrigData(h.OrigData)
		case HdrDETH:
			v := DETH(b[off:])
			v.SetQKey(h.QKey)
			v[4] = 0
			v.SetSrcQP(h.SrcQP)
		case HdrImmDt:
			ImmDt(b[off:]).SetImm(h.Imm)
		case HdrIETH:
			IETH(b[off:]).SetRKey(h.InvRKey)
		case HdrFETH:
			FETH(b[off:]).Set(h.FlushPlacement, h.FlushSelectivity)
		case HdrCNP:
			clear(b[off : off+CNPLen])
		}
	}
	payloadOff = info.HdrLen
	clear(b[payloadOff+payloadLen:]) // pad and ICRC
	return payloadOff, n, nil
}

// FromPacket fills h from a parsed packet, so that h.Encode(b, p.Payload)
// reproduces p.Raw except for the ICRC (and for reserved bits, which
// Encode always zeroes).
func (h *Headers) FromPacket(p *Packet) {
	*h = Headers{
		Opcode: p.Opcode,
		SE:     p.BTH.SE(),
		M:      p.BTH.M(),
		PKey:   p.BTH.PKey(),
		FECN:   p.BTH.FECN(),
		BECN:   p.BTH.BECN(),
		DestQP: p.BTH.DestQP(),
		AckReq: p.BTH.AckReq(),
		PSN:    p.BTH.PSN(),
	}
	if p.RETH != nil {
		h.VA, h.RKey, h.DMALen = p.RETH.VA(), p.RETH.RKey(), p.RETH.DMALen()
	}
	if p.AtomicETH != nil {
		h.VA, h.RKey = p.AtomicETH.VA(), p.AtomicETH.RKey()
		h.SwapAdd, h.Compare = p.AtomicETH.SwapAdd(), p.AtomicETH.Compare()
	}
	if p.AETH != nil {
		h.Syndrome, h.MSN = p.AETH.Syndrome(), p.AETH.MSN()
	}
	if p.AtomicAckETH != nil {
		h.OrigData = p.AtomicAckETH.OrigData()
	}
	if p.DETH != nil {
		h.QKey, h.SrcQP = p.DETH.QKey(), p.DETH.SrcQP()
	}
	if p.ImmDt != nil {
		h.Imm = p.ImmDt.Imm()
	}
	if p.IETH != nil {
		h.InvRKey = p.IETH.RKey()
	}
	if p.FETH != nil {
		h.FlushPlacement, h.FlushSelectivity = p.FETH.PlacementType(), p.FETH.Selectivity()
	}
}
