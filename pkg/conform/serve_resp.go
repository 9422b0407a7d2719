package conform

import (
	"context"
	"fmt"
	"time"

	"github.com/rxed/rxed/pkg/wire"
)

// The engine's conformant responder for requester scenarios: every request
// a scenario does not manipulate is answered as IBA 9.7.5 says a responder
// answers it, from serveState.

// IsRequest accepts the peer's requests to our QP.
func (c *Conn) IsRequest(r *Rx) bool {
	return r.Err == nil && r.Pkt.Info.Flags&wire.FlagRequest != 0 && r.Pkt.BTH.DestQP() == c.OurQPN
}

// NextRequest waits up to d for the peer's next request (responses to our
// own messages, such as a pingpong answer's ACK, are skipped).
func (c *Conn) NextRequest(ctx context.Context, d time.Duration) (*Rx, bool) {
	return c.Next(ctx, d, c.IsRequest)
}

// EPSN is the PSN the engine's responder expects next.
func (c *Conn) EPSN() uint32 { return c.srv.ePSN }

// MSN is the engine's responder's message count.
func (c *Conn) MSN() uint32 { return c.srv.msn }

// reqPackets is how many PSNs a request occupies: a READ its response
// packets, everything else one.
func (c *Conn) reqPackets(r *Rx) int {
	if r.Pkt.Opcode == wire.RCReadRequest {
		return c.segments(int(r.Pkt.RETH.DMALen()))
	}
	return 1
}

// endsMessage reports whether r is the last packet of a message.
func endsMessage(r *Rx) bool {
	f := r.Pkt.Info.Flags
	return f&(wire.FlagLast|wire.FlagOnly) != 0 || f&(wire.FlagRead|wire.FlagAtomic) != 0
}

// Serve answers r as a conformant responder: in order it is executed and
// acknowledged (READ responses, atomic ACKs; ACKs where AckReq asks or a
// message ends), a duplicate is acknowledged again or re-answered, a PSN
// ahead of the expected one gets one sequence NAK.
func (c *Conn) Serve(r *Rx) {
	s := c.srv
	psn := r.PSN()
	switch {
	case psn == s.ePSN:
		s.nakSent = false
		c.execute(r, true)
	case psnBefore(psn, s.ePSN):
		c.duplicate(r)
	default:
		if !s.nakSent {
			s.nakSent = true
			_ = c.SendNAK(s.ePSN, wire.NAKPSNSeqErr, "responder: NAK sequence error (expected PSN)")
		}
	}
}

// Absorb takes r as executed without answering it (a withheld response).
func (c *Conn) Absorb(r *Rx) {
	if r.PSN() == c.srv.ePSN {
		c.execute(r, false)
	}
}

// execute runs the in-order request r; respond sends its response.
func (c *Conn) execute(r *Rx, respond bool) {
	s := c.srv
	p := &r.Pkt
	psn := p.BTH.PSN()
	s.ePSN = psnAdd(psn, c.reqPackets(r))
	f := p.Info.Flags
	switch {
	case f&wire.FlagRead != 0:
		s.msn = (s.msn + 1) & 0xffffff
		s.reads = append(s.reads, readReq{psn: psn, va: p.RETH.VA(), n: int(p.RETH.DMALen())})
		if len(s.reads) > 64 {
			s.reads = s.reads[1:]
		}
		if respond {
			c.ReadResponse(psn, p.RETH.VA(), int(p.RETH.DMALen()), 0, -1, "responder: READ response")
		}
	case f&wire.FlagAtomic != 0:
		s.msn = (s.msn + 1) & 0xffffff
		va := p.AtomicETH.VA()
		orig := s.words[va]
		if p.Opcode == wire.RCCompareSwap {
			if orig == p.AtomicETH.Compare() {
				s.words[va] = p.AtomicETH.SwapAdd()
			}
		} else {
			s.words[va] = orig + p.AtomicETH.SwapAdd()
		}
		s.atomics[psn] = orig
		if respond {
			_ = c.AtomicAck(psn, orig, "responder: ATOMIC ACK")
		}
	default: // SEND, WRITE
		if f&wire.FlagSend != 0 {
			s.msgLen += len(p.Payload)
		}
		last := f&(wire.FlagLast|wire.FlagOnly) != 0
		if last {
			s.msn = (s.msn + 1) & 0xffffff
		}
		if respond && (p.BTH.AckReq() || last) {
			_ = c.SendACK(psn, "responder: ACK")
		}
		if last && f&wire.FlagSend != 0 {
			n := s.msgLen
			s.msgLen = 0
			if respond && c.Tool.Echoes() {
				// ibv_rc_pingpong's server answers every message with one
				// of its size.
				_, _, _ = c.sendMsg(pattern(n, 0x5a), true, "pingpong answer")
			}
		}
	}
}

// duplicate answers a request the responder has already executed (IBA
// 9.7.5.1.2): SEND/WRITE with an ACK of the latest PSN, a READ again from
// "memory", an atomic from its saved result.
func (c *Conn) duplicate(r *Rx) {
	s := c.srv
	p := &r.Pkt
	psn := p.BTH.PSN()
	f := p.Info.Flags
	switch {
	case f&wire.FlagRead != 0:
		// A READ retried from inside an executed one continues that
		// READ's response sequence (MIDDLE ... LAST with its PSNs), as
		// rdma_rxe's duplicate_request replays it; from its first PSN it
		// is answered whole again.
		for _, rd := range s.reads {
			if idx := int((psn - rd.psn) & 0xffffff); idx > 0 && idx < c.segments(rd.n) {
				c.ReadResponse(rd.psn, rd.va, rd.n, idx, -1, "responder: READ retried from its middle, answered from there")
				return
			}
		}
		c.ReadResponse(psn, p.RETH.VA(), int(p.RETH.DMALen()), 0, -1, "responder: duplicate READ answered again")
	case f&wire.FlagAtomic != 0:
		if orig, ok := s.atomics[psn]; ok {
			_ = c.AtomicAck(psn, orig, "responder: duplicate atomic, saved result")
		}
	default:
		_ = c.SendACK(psnAdd(s.ePSN, -1), "responder: duplicate re-ACKed")
	}
}

// SendACK acknowledges up to psn with the current MSN.
func (c *Conn) SendACK(psn uint32, note string) error {
	return c.sendAETH(wire.RCAck, psn, wire.ACKSyndrome(0x1f), c.srv.msn, note)
}

// SendNAK sends a NAK with code for psn.
func (c *Conn) SendNAK(psn uint32, code uint8, note string) error {
	return c.sendAETH(wire.RCAck, psn, wire.NAKSyndrome(code), c.srv.msn, note)
}

// SendRNR sends an RNR NAK for psn with the RNR timer code.
func (c *Conn) SendRNR(psn uint32, timer uint8, note string) error {
	return c.sendAETH(wire.RCAck, psn, wire.RNRSyndrome(timer), c.srv.msn, note)
}

func (c *Conn) sendAETH(op wire.Opcode, psn uint32, syn wire.Syndrome, msn uint32, note string) error {
	if syn.Kind() == wire.SynACK {
		c.srv.lastResp = psn & 0xffffff
	}
	h := wire.Headers{Opcode: op, PKey: DefaultPKey, DestQP: c.PeerQPN, PSN: psn & 0xffffff, Syndrome: syn, MSN: msn}
	return c.Send(h, nil, note)
}

// AtomicAck answers an atomic at psn with orig.
func (c *Conn) AtomicAck(psn uint32, orig uint64, note string) error {
	h := wire.Headers{Opcode: wire.RCAtomicAck, PKey: DefaultPKey, DestQP: c.PeerQPN, PSN: psn,
		Syndrome: wire.ACKSyndrome(0x1f), MSN: c.srv.msn, OrigData: orig}
	c.srv.lastResp = psn
	return c.Send(h, nil, note)
}

// readData is the engine's "memory" at va: a pattern of the address, so a
// response at any offset carries the same bytes.
func readData(va uint64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((va + uint64(i)) * 7)
	}
	return b
}

// ReadResponse sends the response packets [from, to) (to < 0: all) of a
// READ of n bytes at va requested at psn: FIRST/MIDDLE/LAST or ONLY with
// PSNs psn+i, AETH on FIRST, LAST and ONLY (IBA 9.7.5.1.3).
func (c *Conn) ReadResponse(psn uint32, va uint64, n, from, to int, note string) {
	segs := c.segments(n)
	if to < 0 || to > segs {
		to = segs
	}
	for i := from; i < to; i++ {
		lo, hi := i*c.MTU, min(n, (i+1)*c.MTU)
		if hi < lo {
			hi = lo
		}
		var op wire.Opcode
		switch {
		case segs == 1:
			op = wire.RCReadResponseOnly
		case i == 0:
			op = wire.RCReadResponseFirst
		case i == segs-1:
			op = wire.RCReadResponseLast
		default:
			op = wire.RCReadResponseMiddle
		}
		h := wire.Headers{Opcode: op, PKey: DefaultPKey, DestQP: c.PeerQPN, PSN: psnAdd(psn, i),
			Syndrome: wire.ACKSyndrome(0x1f), MSN: c.srv.msn}
		c.srv.lastResp = h.PSN
		_ = c.Send(h, readData(va+uint64(lo), hi-lo), fmt.Sprintf("%s (%d/%d)", note, i+1, segs))
	}
}

// ServeFor answers requests as a conformant responder for d.
func (c *Conn) ServeFor(ctx context.Context, d time.Duration) {
	deadline := c.deadline(d)
	for ctx.Err() == nil {
		left := c.left(deadline)
		if left <= 0 {
			return
		}
		if r, ok := c.NextRequest(ctx, left); ok {
			c.Serve(r)
		}
	}
}

// PeerQPAlive tells whether the peer's QP still answers as a responder:
// a zero-length RDMA WRITE (no R_Key needed, IBA 9.4.4) with AckReq at our
// send PSN. Any ACK or NAK for it means the QP is not in the error state
// (which drops every packet). Use it last: a NAK may end the QP.
func (c *Conn) PeerQPAlive(ctx context.Context) (string, bool) {
	h := c.Hdr(wire.RCWriteOnly)
	h.DMALen, h.AckReq = 0, true
	c.next(1)
	if err := c.Send(h, nil, "liveness probe: zero-length WRITE to the peer's QP"); err != nil {
		return err.Error(), false
	}
	r, ok := c.ResponseTo(ctx, h.PSN, answerWait)
	if !ok {
		return fmt.Sprintf("no answer to a zero-length WRITE psn=%#x in %v: the peer's QP is in the error state", h.PSN, answerWait), false
	}
	return "the peer's QP answered a zero-length WRITE: " + r.String(), true
}
