package hostile

import (
	"encoding/binary"

	"github.com/rxed/rxed/pkg/wire"
)

// An input of FuzzEngineReceive is a flags byte (bit 0: IPv6) and then
// up to maxPackets records, each
//
//	c0 c1 c2 lenLo lenHi body[len]
//
// body being the UDP payload without its ICRC (the harness seals it for
// the source's address, or damages the seal). The control bytes make the
// fuzzer's job the protocol, not the guessing of QP numbers, PSNs and
// keys the target drew at random:
//
//	c0 bits 0-1: source (srcPeer, srcPeerPort, srcStranger, srcStrangerPort)
//	c0 bits 2-3: 3 = ICRC wrong, 2 = IPv4 Identification c1<<8|c2 (not 0)
//	c0 bits 4-7: destination QP (qsel*)
//	c1 bits 0-2: PSN (psn*, with c2's low 3 bits as a distance)
//	c1 bits 3-4: RETH/AtomicETH rkey (keep, w, ro, loc)
//	c1 bits 5-6: RETH/AtomicETH VA (keep, in w, in ro, at w's end)
//	c2 bit 4:    DETH Q_Key of the destination (UD's or QP 1's)
const (
	recHeader  = 5
	maxPackets = 16
	maxBody    = 4200
)

// Sources.
const (
	srcPeer         = iota // the peer's own socket, peer:4791
	srcPeerPort            // the peer's address, another port
	srcStranger            // another host, port 4791
	srcStrangerPort        // another host, another port
)

// Destination QPs, by c0's high nibble.
const (
	qselKeep = iota
	qselRC
	qselUC
	qselUD
	qselQP1
	qselMcast
	qselUnused
)

var qselOf = [16]int{qselRC, qselRC, qselRC, qselUC, qselUC, qselUD, qselUD, qselQP1,
	qselQP1, qselMcast, qselMcast, qselUnused, qselKeep, qselKeep, qselRC, qselUC}

// PSN modes.
const (
	psnKeep    = iota
	psnExpect  // the RC responder's ePSN
	psnDup     // behind it by 1..8
	psnAhead   // ahead of it by 1..8
	psnSentDup // the RC requester's sent PSNs: its next PSN - 1..8
	psnSentNew // its next PSN + 0..7 (never sent)
)

type hostilePkt struct {
	src      int
	badICRC  bool
	ipv4ID   uint16 // the Identification the ICRC covers (IPv4)
	qsel     int
	psn      int
	dist     uint32
	rkey, va int
	qkey     bool
	body     []byte
}

func decodeInput(data []byte) (v6 bool, pkts []hostilePkt) {
	if len(data) == 0 {
		return false, nil
	}
	v6 = data[0]&1 != 0
	data = data[1:]
	for len(data) >= recHeader && len(pkts) < maxPackets {
		c0, c1, c2 := data[0], data[1], data[2]
		n := int(binary.LittleEndian.Uint16(data[3:]))
		data = data[recHeader:]
		n = min(n, len(data), maxBody)
		pkts = append(pkts, hostilePkt{
			src: int(c0 & 3), badICRC: c0>>2&3 == 3, qsel: qselOf[c0>>4],
			ipv4ID: idOf(c0, c1, c2),
			psn:    int(c1 & 7), dist: uint32(c2&7) + 1, rkey: int(c1 >> 3 & 3), va: int(c1 >> 5 & 3),
			qkey: c2&0x10 != 0,
			body: data[:n],
		})
		data = data[n:]
	}
	return v6, pkts
}

// idOf is the IPv4 Identification a record asks for: 0, as rxed and
// Linux send, unless c0 bits 2-3 are 2.
func idOf(c0, c1, c2 byte) uint16 {
	if c0>>2&3 != 2 {
		return 0
	}
	return uint16(c1)<<8 | uint16(c2)
}

// encodeInput is decodeInput's inverse for the seeds.
func encodeInput(v6 bool, pkts ...hostilePkt) []byte {
	b := []byte{0}
	if v6 {
		b[0] = 1
	}
	for _, p := range pkts {
		c0 := byte(p.src)
		if p.badICRC {
			c0 |= 3 << 2
		}
		for i, q := range qselOf {
			if q == p.qsel {
				c0 |= byte(i) << 4
				break
			}
		}
		c1 := byte(p.psn) | byte(p.rkey)<<3 | byte(p.va)<<5
		c2 := byte(p.dist-1) & 7
		if p.qkey {
			c2 |= 0x10
		}
		b = append(b, c0, c1, c2, 0, 0)
		binary.LittleEndian.PutUint16(b[len(b)-2:], uint16(len(p.body)))
		b = append(b, p.body...)
	}
	return b
}

// build makes the datagram of p for world w: body, then an ICRC slot,
// with the fields the control bytes patch; it returns the packet and the
// destination QP it went to (0xFFFFFFFF when too short to have one).
func (w *world) build(p *hostilePkt) (pkt []byte, destQP uint32) {
	pkt = append(append(make([]byte, 0, len(p.body)+wire.ICRCLen), p.body...), 0, 0, 0, 0)
	if len(pkt) < wire.BTHLen+wire.ICRCLen {
		return pkt, 0xFFFFFFFF
	}
	bth := wire.BTH(pkt[:wire.BTHLen])
	switch p.qsel {
	case qselRC:
		bth.SetDestQP(w.rc.Num())
	case qselUC:
		bth.SetDestQP(w.uc.Num())
	case qselUD:
		bth.SetDestQP(w.ud.Num())
	case qselQP1:
		bth.SetDestQP(1)
	case qselMcast:
		bth.SetDestQP(0xFFFFFF)
	case qselUnused:
		bth.SetDestQP(w.unusedQPN)
	}
	switch p.psn {
	case psnExpect:
		bth.SetPSN(w.rqPSN())
	case psnDup:
		bth.SetPSN((w.rqPSN() - p.dist) & 0xFFFFFF)
	case psnAhead:
		bth.SetPSN((w.rqPSN() + p.dist) & 0xFFFFFF)
	case psnSentDup:
		bth.SetPSN((w.sqPSN() - p.dist) & 0xFFFFFF)
	case psnSentNew:
		bth.SetPSN((w.sqPSN() + p.dist - 1) & 0xFFFFFF)
	}
	var parsed wire.Packet
	_ = parsed.Parse(pkt) // header views are set as far as the packet goes
	rkey := func() (uint32, bool) {
		switch p.rkey {
		case 1:
			return w.w.RKey(), true
		case 2:
			return w.ro.RKey(), true
		case 3:
			return w.loc.LKey(), true
		}
		return 0, false
	}
	va := func(old uint64) (uint64, bool) {
		switch p.va {
		case 1:
			return w.w.IOVA() + old%wLen, true
		case 2:
			return w.ro.IOVA() + old%smallLen, true
		case 3:
			return w.w.IOVA() + wLen - old%64, true
		}
		return 0, false
	}
	if r := parsed.RETH; r != nil {
		if k, ok := rkey(); ok {
			r.SetRKey(k)
		}
		if v, ok := va(r.VA()); ok {
			r.SetVA(v)
		}
	}
	if a := parsed.AtomicETH; a != nil {
		if k, ok := rkey(); ok {
			a.SetRKey(k)
		}
		if v, ok := va(a.VA()); ok {
			a.SetVA(v &^ 7)
		}
	}
	if d := parsed.DETH; d != nil && p.qkey {
		if bth.DestQP() == 1 {
			d.SetQKey(0x80010000)
		} else {
			d.SetQKey(udQKey)
		}
	}
	return pkt, bth.DestQP()
}
