package conform

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/rxed/rxed/pkg/wire"
)

// Responder scenarios: PSN sequence errors and duplicates (IBA 9.7.5.1.2,
// 9.7.5.2.1, 9.7.5.2.2).

func init() {
	add(&Scenario{ID: "R-SEQ-NAK", Title: "a PSN ahead of the expected one is NAKed", Role: PeerResponder,
		Rule: "IBA 9.7.5.2.2, C9-107", Expect: "NAK PSN sequence error carrying the expected PSN and MSN 0",
		Tools: rcTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			expected := c.PSN
			h, payload := c.ProbeHeaders()
			h.PSN = psnAdd(expected, 2)
			if err := c.Send(h, payload, "PSN expected+2 (two skipped)"); err != nil {
				return Errorf("%v", err)
			}
			return expectNAK(ctx, c, expected, wire.NAKPSNSeqErr, 0, "out-of-sequence request")
		}})
	add(&Scenario{ID: "R-SEQ-NAK-ONCE", Title: "a sequence error is NAKed once, not per packet", Role: PeerResponder,
		Rule: "IBA 9.7.5.2.2 (one NAK per sequence error), C9-107", Expect: "exactly one NAK for three out-of-sequence packets, then the expected PSN resumes the QP",
		Tools: rcTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			expected := c.PSN
			for i := range 3 {
				h, payload := c.ProbeHeaders()
				h.PSN = psnAdd(expected, 2+i)
				if err := c.Send(h, payload, fmt.Sprintf("out of sequence %d/3", i+1)); err != nil {
					return Errorf("%v", err)
				}
			}
			// Wait for the first answer however slow the peer (a fixed
			// window failed slow peers with "no NAK"), then listen as long
			// for a second NAK.
			got := c.responses(ctx, 1, silenceWait+200*time.Millisecond)
			naks := 0
			for _, r := range got {
				if r.Syn().Kind() == wire.SynNAK && r.Syn().NAKCode() == wire.NAKPSNSeqErr {
					naks++
				} else {
					return Failf("unexpected %s to out-of-sequence packets", r)
				}
			}
			switch {
			case naks == 0:
				return Failf("no NAK for three packets ahead of psn=%#x", expected)
			case naks > 1:
				return Failf("%d sequence NAKs for one sequence error (first %s)", naks, got[0])
			case got[0].PSN() != expected:
				return Failf("NAK names psn=%#x, want the expected %#x", got[0].PSN(), expected)
			case msnWrong(got[0], 0) != "":
				return Failf("%s: out-of-sequence packets complete nothing", msnWrong(got[0], 0))
			}
			ev, ok := c.ProbeAnswered(ctx, 1)
			if !ok {
				return Failf("one NAK (%s), but resending the expected PSN failed: %s", got[0], ev)
			}
			return Passf("one NAK %s; resent expected PSN: %s", got[0], ev)
		}})
	add(&Scenario{ID: "R-SEQ-RECOVER", Title: "after a sequence NAK the requester's resend is executed", Role: PeerResponder,
		Rule: "IBA 9.7.5.2.2, 9.7.4.1.5 (go-back-N)", Expect: "the resent PSNs are executed and ACKed with MSN counting each once",
		Tools: rcWriteOrSend,
		Run: func(ctx context.Context, c *Conn) Outcome {
			first := c.PSN
			h, payload := c.ProbeHeaders()
			h.PSN = psnAdd(first, 1)
			_ = c.Send(h, payload, "second request first: first one 'lost'")
			n := expectNAK(ctx, c, first, wire.NAKPSNSeqErr, 0, "gap")
			if n.Verdict != Pass {
				return n
			}
			c.Probe("go back: first request")
			p, _ := c.Probe("go back: second request")
			return combine(n, expectACK(ctx, c, p, 2, "after go-back-N"))
		}})
	add(&Scenario{ID: "R-DUP-WRITE", Title: "a duplicate WRITE is re-ACKed, not re-executed", Role: PeerResponder,
		Rule: "IBA 9.7.5.1.2 (duplicate requests), C9-100", Expect: "ACK with the unchanged MSN and a PSN from the duplicate's to the latest request's (never one not received); memory keeps the later write",
		Tools: writeTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			a, b := bytes.Repeat([]byte{0xaa}, 32), bytes.Repeat([]byte{0xbb}, 32)
			pa, _ := c.WriteOnly(a, 512, true, "WRITE A")
			o1 := expectACK(ctx, c, pa, 1, "WRITE A")
			pb, _ := c.WriteOnly(b, 512, true, "WRITE B, same place")
			o2 := expectACK(ctx, c, pb, 2, "WRITE B")
			if o := combine(o1, o2); o.Verdict != Pass {
				return o
			}
			h := c.Hdr(wire.RCWriteOnly)
			h.PSN, h.VA, h.RKey, h.DMALen, h.AckReq = pa, c.VA+512, c.RKey, 32, true
			_ = c.Send(h, a, "duplicate of WRITE A")
			r, ok := c.Response(ctx, answerWait)
			switch {
			case !ok:
				return Failf("no ACK for the duplicate psn=%#x", pa)
			case r.Syn().Kind() != wire.SynACK:
				return Failf("duplicate WRITE got %s, want ACK", r)
			case r.MSN() != 2:
				return Failf("duplicate ACK %s has MSN %d: the MSN must not move (2)", r, r.MSN())
			case !dupACKPSNOK(r.PSN(), pa, pb):
				return Failf("duplicate of psn=%#x ACKed at psn=%#x: %s", pa, r.PSN(), dupACKRule(pa, pb))
			}
			// Read back where the tool allows it.
			rp, _ := c.ReadReq(512, 32, "READ back: B expected")
			rr, ok := c.ResponseTo(ctx, rp, answerWait)
			if !ok || rr.Pkt.Opcode != wire.RCReadResponseOnly {
				return Passf("duplicate re-ACKed: %s (memory not readable with this tool)", r)
			}
			if !bytes.Equal(rr.Pkt.Payload, b) {
				return Failf("duplicate WRITE was executed again: memory holds A after %s", r)
			}
			if why := msnWrong(rr, 3); why != "" {
				return Failf("READ after two WRITEs and a duplicate: %s (the duplicate is no message)", why)
			}
			return Passf("duplicate re-ACKed %s, memory still B (%s)", r, rr)
		}})
	add(&Scenario{ID: "R-DUP-SEND", Title: "a duplicate SEND is re-ACKed, not delivered again", Role: PeerResponder,
		Rule: "IBA 9.7.5.1.2, C9-100", Expect: "ACK for the duplicate with the unchanged MSN and a PSN of the duplicated SEND's; no second receive completion (a pingpong server does not answer it)",
		Tools: sendTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			start := len(c.Trace())
			firstPSN, last, err := c.SendMsg(pattern(c.SendLen(16), 5), "SEND")
			if err != nil {
				return Errorf("%v", err)
			}
			var pkts [][]byte
			for _, e := range c.Trace()[start:] {
				if e.Dir == Out {
					pkts = append(pkts, e.Raw)
				}
			}
			o := expectACK(ctx, c, last, 1, "SEND")
			if o.Verdict != Pass {
				return o
			}
			if c.Tool.Echoes() && !c.waitPeerMessages(ctx, 1, answerWait) {
				return Failf("the pingpong server did not answer the first SEND")
			}
			echoes := c.PeerMessages()
			for _, p := range pkts {
				_ = c.SendRaw(p, "duplicate SEND")
			}
			r, ok := c.Response(ctx, answerWait)
			switch {
			case !ok:
				return Failf("no ACK for the duplicate SEND psn=%#x", last)
			case r.Syn().Kind() != wire.SynACK || r.MSN() != 1:
				return Failf("duplicate SEND got %s, want ACK with MSN 1", r)
			case !dupACKPSNOK(r.PSN(), firstPSN, last):
				return Failf("duplicate of psn=%#x..%#x ACKed at psn=%#x: %s", firstPSN, last, r.PSN(), dupACKRule(firstPSN, last))
			}
			if c.Tool.Echoes() {
				if c.waitPeerMessages(ctx, echoes+1, silenceWait) {
					return Failf("duplicate delivered again: the server answered it (%d answers)", c.PeerMessages())
				}
				return Passf("duplicate re-ACKed %s; no second answer (%d)", r, echoes)
			}
			return Passf("duplicate re-ACKed %s", r)
		}})
	add(&Scenario{ID: "R-DUP-READ", Title: "a duplicate READ is answered again", Role: PeerResponder,
		Rule: "IBA 9.7.5.1.2 (duplicate RDMA READ re-executed), C9-101", Expect: "the same responses (opcodes FIRST/MIDDLE/LAST), PSNs and data again; MSN 1 throughout (the duplicate is no new message)",
		Tools: readTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			n := 3 * c.MTU
			h := c.Hdr(wire.RCReadRequest)
			h.VA, h.RKey, h.DMALen = c.VA, c.RKey, uint32(n)
			c.next(3)
			_ = c.Send(h, nil, "READ 3 PMTU")
			// Each answer is awaited, then extras are listened for: in
			// fixed windows a slow peer's late responses to the original
			// were missed, or taken for the duplicate's.
			first := c.responses(ctx, 3, silenceWait)
			if len(first) != 3 {
				return Failf("original READ got %d responses, want 3", len(first))
			}
			_ = c.Send(h, nil, "duplicate READ")
			again := c.responses(ctx, 3, silenceWait)
			if len(again) != 3 {
				return Failf("duplicate READ got %d responses, want 3", len(again))
			}
			for i := range 3 {
				if again[i].PSN() != first[i].PSN() || !bytes.Equal(again[i].Pkt.Payload, first[i].Pkt.Payload) {
					return Failf("duplicate response %d %s differs from %s", i+1, again[i], first[i])
				}
				// The duplicate is the whole READ again: a requester that
				// lost every response takes them as a new sequence and
				// drops one that continues another (rxe_comp.c check_ack:
				// only FIRST or ONLY may start a READ's responses).
				if again[i].Pkt.Opcode != first[i].Pkt.Opcode {
					return Failf("duplicate response %d is %s, the original's %s: a duplicate from the READ's first PSN is answered as the whole READ", i+1, again[i], first[i].Pkt.Opcode)
				}
			}
			if why := msnsWrong(append(first, again...), 1); why != "" {
				return Failf("%s (one READ and its duplicate: one message)", why)
			}
			return Passf("answered twice, psn=%#x..%#x identical", first[0].PSN(), first[2].PSN())
		}})
	add(&Scenario{ID: "R-DUP-READ-MIDDLE", Title: "a duplicate READ starting at a middle PSN", Role: PeerResponder,
		Rule: "IBA 9.7.5.1.2 (duplicate READ at a PSN inside the original)", Expect: "responses from that PSN on, data from the matching offset; MSN 1 throughout",
		Tools: readTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			n := 3 * c.MTU
			h := c.Hdr(wire.RCReadRequest)
			h.VA, h.RKey, h.DMALen = c.VA, c.RKey, uint32(n)
			c.next(3)
			_ = c.Send(h, nil, "READ 3 PMTU")
			first := c.responses(ctx, 3, silenceWait) // awaited, as in R-DUP-READ
			if len(first) != 3 {
				return Failf("original READ got %d responses, want 3", len(first))
			}
			d := h
			d.PSN, d.VA, d.DMALen = psnAdd(h.PSN, 1), c.VA+uint64(c.MTU), uint32(2*c.MTU)
			_ = c.Send(d, nil, "duplicate READ from the middle PSN")
			again := c.responses(ctx, 2, silenceWait)
			if len(again) != 2 {
				return Failf("duplicate from psn=%#x got %d responses, want 2", d.PSN, len(again))
			}
			for i := range 2 {
				if again[i].PSN() != psnAdd(d.PSN, i) || !bytes.Equal(again[i].Pkt.Payload, first[i+1].Pkt.Payload) {
					return Failf("duplicate response %d: %s, want psn=%#x with the bytes of %s", i+1, again[i], psnAdd(d.PSN, i), first[i+1])
				}
			}
			if why := msnsWrong(append(first, again...), 1); why != "" {
				return Failf("%s (one READ and its duplicate: one message)", why)
			}
			return Passf("re-answered from psn=%#x: %s, %s", d.PSN, again[0], again[1])
		}})
	add(&Scenario{ID: "R-DUP-ATOMIC", Title: "a duplicate atomic is answered from the saved result", Role: PeerResponder,
		Rule: "IBA 9.7.5.1.2 (atomic responder resources), C9-102", Expect: "the duplicate's ATOMIC ACK repeats the original value and MSN 1; memory changed once; the next atomic is MSN 2",
		Tools: atomTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			h := c.Hdr(wire.RCFetchAdd)
			h.VA, h.RKey, h.SwapAdd = c.VA+24, c.RKey, 1
			c.next(1)
			_ = c.Send(h, nil, "FETCH_ADD +1")
			r1, ok := c.ResponseTo(ctx, h.PSN, answerWait)
			if !ok || r1.Pkt.AtomicAckETH == nil {
				return Failf("no ATOMIC ACK for psn=%#x", h.PSN)
			}
			_ = c.Send(h, nil, "duplicate FETCH_ADD +1")
			r2, ok := c.ResponseTo(ctx, h.PSN, answerWait)
			if !ok || r2.Pkt.AtomicAckETH == nil {
				return Failf("no ATOMIC ACK for the duplicate psn=%#x", h.PSN)
			}
			x := r1.Pkt.AtomicAckETH.OrigData()
			if r2.Pkt.AtomicAckETH.OrigData() != x {
				return Failf("duplicate answered orig=%#x, the original said %#x: executed again", r2.Pkt.AtomicAckETH.OrigData(), x)
			}
			p, _ := c.Atomic(wire.RCFetchAdd, 24, 0, 0, "FETCH_ADD +0 (reads)")
			r3, ok := c.ResponseTo(ctx, p, answerWait)
			if !ok || r3.Pkt.AtomicAckETH == nil {
				return Failf("no ATOMIC ACK for the read-back")
			}
			if y := r3.Pkt.AtomicAckETH.OrigData(); y != x+1 {
				return Failf("memory is %#x after one +1 and a duplicate, want %#x", y, x+1)
			}
			if why := msnsWrong([]*Rx{r1, r2}, 1); why != "" {
				return Failf("%s (an atomic and its duplicate: one message)", why)
			}
			if why := msnWrong(r3, 2); why != "" {
				return Failf("the atomic after the duplicate: %s", why)
			}
			return Passf("duplicate repeated orig=%#x; memory %#x (%s)", x, x+1, r3)
		}})
}
