package wire

import "encoding/binary"

// BTH is a view of the 12-byte Base Transport Header. It must be at least
// BTHLen long (Packet.Parse guarantees that).
//
//	0: OpCode | 1: SE M PadCnt(2) TVer(4) | 2-3: P_Key
//	4: FECN BECN resv6 | 5-7: DestQP | 8: AckReq resv7 | 9-11: PSN
type BTH []byte

const (
	bthOpcode = 0
	bthFlags  = 1
	bthPKey   = 2
	bthFECN   = 4 // also the ICRC-masked byte (FECN, BECN, resv6)
	bthDestQP = 5
	bthAckReq = 8
	bthPSN    = 9
)

// Mask of the 24-bit QPN and PSN fields.
const (
	QPNMask = 0xFFFFFF
	PSNMask = 0xFFFFFF
)

// Opcode returns the OpCode.
func (b BTH) Opcode() Opcode { return Opcode(b[bthOpcode]) }

// SetOpcode sets the OpCode.
func (b BTH) SetOpcode(op Opcode) { b[bthOpcode] = byte(op) }

// SE returns the Solicited Event bit.
func (b BTH) SE() bool { return b[bthFlags]&0x80 != 0 }

// SetSE sets the Solicited Event bit.
func (b BTH) SetSE(v bool) { setBit(&b[bthFlags], 0x80, v) }

// M returns the MigReq bit.
func (b BTH) M() bool { return b[bthFlags]&0x40 != 0 }

// SetM sets the MigReq bit.
func (b BTH) SetM(v bool) { setBit(&b[bthFlags], 0x40, v) }

// PadCount returns the number of pad bytes (0-3) after the payload.
func (b BTH) PadCount() int { return int(b[bthFlags]>>4) & 3 }

// SetPadCount sets the pad count; only the low two bits of n are used.
func (b BTH) SetPadCount(n int) { b[bthFlags] = b[bthFlags]&^0x30 | byte(n&3)<<4 }

// TVer returns the transport header version (must be 0).
func (b BTH) TVer() uint8 { return b[bthFlags] & 0x0F }

// SetTVer sets the transport header version (low four bits of v).
func (b BTH) SetTVer(v uint8) { b[bthFlags] = b[bthFlags]&^0x0F | v&0x0F }

// PKey returns the partition key.
func (b BTH) PKey() uint16 { return binary.BigEndian.Uint16(b[bthPKey:]) }

// SetPKey sets the partition key.
func (b BTH) SetPKey(v uint16) { binary.BigEndian.PutUint16(b[bthPKey:], v) }

// FECN returns the forward explicit congestion notification bit.
func (b BTH) FECN() bool { return b[bthFECN]&0x80 != 0 }

// SetFECN sets the FECN bit.
func (b BTH) SetFECN(v bool) { setBit(&b[bthFECN], 0x80, v) }

// BECN returns the backward explicit congestion notification bit.
func (b BTH) BECN() bool { return b[bthFECN]&0x40 != 0 }

// SetBECN sets the BECN bit.
func (b BTH) SetBECN(v bool) { setBit(&b[bthFECN], 0x40, v) }

// Resv6 returns the six reserved bits after FECN/BECN.
func (b BTH) Resv6() uint8 { return b[bthFECN] & 0x3F }

// DestQP returns the 24-bit destination QP number.
func (b BTH) DestQP() uint32 { return be24(b[bthDestQP:]) }

// SetDestQP sets the destination QP number (low 24 bits of qpn).
func (b BTH) SetDestQP(qpn uint32) { putBE24(b[bthDestQP:], qpn) }

// AckReq returns the acknowledge-request bit.
func (b BTH) AckReq() bool { return b[bthAckReq]&0x80 != 0 }

// SetAckReq sets the acknowledge-request bit.
func (b BTH) SetAckReq(v bool) { setBit(&b[bthAckReq], 0x80, v) }

// Resv7 returns the seven reserved bits after AckReq.
func (b BTH) Resv7() uint8 { return b[bthAckReq] & 0x7F }

// PSN returns the 24-bit packet sequence number.
func (b BTH) PSN() uint32 { return be24(b[bthPSN:]) }

// SetPSN sets the packet sequence number (low 24 bits of psn).
func (b BTH) SetPSN(psn uint32) { putBE24(b[bthPSN:], psn) }

func setBit(p *byte, mask byte, v bool) {
	if v {
		*p |= mask
	} else {
		*p &^= mask
	}
}
