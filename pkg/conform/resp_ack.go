package conform

import (
	"bytes"
	"context"
	"fmt"

	"github.com/rxed/rxed/pkg/wire"
)

// Responder scenarios: in-order requests are acknowledged with the right
// PSN and MSN (IBA 9.7.5.1, 9.7.6.1).

func init() {
	add(&Scenario{ID: "R-ACK-WRITE", Title: "WRITE ONLY with AckReq is ACKed", Role: PeerResponder,
		Rule: "IBA 9.7.5.1.1, C9-110", Expect: "ACK with the request's PSN, MSN 1", Tools: writeTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			psn, err := c.WriteOnly(pattern(64, 1), 0, true, "WRITE ONLY, AckReq")
			if err != nil {
				return Errorf("%v", err)
			}
			return expectACK(ctx, c, psn, 1, "WRITE ONLY")
		}})
	add(&Scenario{ID: "R-ACK-WRITE-MULTI", Title: "multi-packet WRITE is ACKed at its LAST", Role: PeerResponder,
		Rule: "IBA 9.7.5.1.1", Expect: "ACK for the LAST packet's PSN, MSN 1 (one message)", Tools: writeTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			_, last, err := c.WriteMsg(pattern(3*c.MTU, 2), 0, "WRITE FIRST/MIDDLE/LAST")
			if err != nil {
				return Errorf("%v", err)
			}
			return expectACK(ctx, c, last, 1, "3-packet WRITE")
		}})
	add(&Scenario{ID: "R-ACK-COALESCE", Title: "ACKs coalesce up to the AckReq packet", Role: PeerResponder,
		Rule: "IBA 9.7.5.1.1 (coalesced ACKs), C9-111", Expect: "an ACK for the AckReq'ed PSN with MSN = all 5 messages; earlier ACKs optional",
		Tools: rcWriteOrSend,
		Run: func(ctx context.Context, c *Conn) Outcome {
			var last uint32
			for i := range 5 {
				note := fmt.Sprintf("message %d of 5", i+1)
				var err error
				if c.Tool == IBWriteBW {
					last, err = c.WriteOnly(pattern(8, byte(i)), uint64(8*i), i == 4, note)
				} else {
					_, last, err = c.sendMsg(pattern(c.SendLen(8), byte(i)), i == 4, note)
				}
				if err != nil {
					return Errorf("%v", err)
				}
			}
			return expectACK(ctx, c, last, 5, "5 messages, AckReq on the last")
		}})
	add(&Scenario{ID: "R-ACK-SEND", Title: "SEND ONLY with AckReq is ACKed", Role: PeerResponder,
		Rule: "IBA 9.7.5.1.1, C9-110", Expect: "ACK with the SEND's PSN, MSN 1", Tools: sendTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			_, psn, err := c.SendMsg(pattern(c.SendLen(64), 1), "SEND, AckReq")
			if err != nil {
				return Errorf("%v", err)
			}
			return expectACK(ctx, c, psn, 1, "SEND ONLY")
		}})
	add(&Scenario{ID: "R-ACK-SEND-MULTI", Title: "multi-packet SEND is ACKed at its LAST", Role: PeerResponder,
		Rule: "IBA 9.7.5.1.1", Expect: "ACK for the LAST packet's PSN, MSN 1", Tools: sendTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			n := c.SendLen(2*c.MTU + 100)
			if c.segments(n) < 2 {
				return Skipf("the tool's message size %d fits one packet of PMTU %d", n, c.MTU)
			}
			_, last, err := c.SendMsg(pattern(n, 2), "SEND FIRST/MIDDLE/LAST")
			if err != nil {
				return Errorf("%v", err)
			}
			return expectACK(ctx, c, last, 1, "3-packet SEND")
		}})
	add(&Scenario{ID: "R-READ-ONLY", Title: "READ of one packet", Role: PeerResponder,
		Rule: "IBA 9.7.4.1.4, 9.7.5.1.3", Expect: "READ RESPONSE ONLY with the request's PSN, the bytes asked for and an ACK AETH with MSN 1",
		Tools: readTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			psn, err := c.ReadReq(0, 64, "READ 64 bytes")
			if err != nil {
				return Errorf("%v", err)
			}
			r, ok := c.Response(ctx, answerWait)
			switch {
			case !ok:
				return Failf("no READ response within %v", answerWait)
			case r.Pkt.Opcode != wire.RCReadResponseOnly || r.PSN() != psn:
				return Failf("want READ_RESPONSE_ONLY psn=%#x, got %s", psn, r)
			case len(r.Pkt.Payload) != 64:
				return Failf("READ response carries %d bytes, want 64", len(r.Pkt.Payload))
			case r.Syn().Kind() != wire.SynACK:
				return Failf("READ response AETH is %s, want an ACK syndrome", synName(r.Syn()))
			case msnWrong(r, 1) != "":
				return Failf("%s: the READ is the first message", msnWrong(r, 1))
			}
			return Passf("%s", r)
		}})
	add(&Scenario{ID: "R-READ-MULTI", Title: "READ of three packets: FIRST/MIDDLE/LAST", Role: PeerResponder,
		Rule: "IBA 9.7.5.1.3, C9-89", Expect: "responses with consecutive PSNs from the request's, AETH on FIRST and LAST only (MSN 1: one message), PMTU-sized but the last",
		Tools: readTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			n := 3 * c.MTU
			psn, err := c.ReadReq(0, n, "READ 3 PMTU")
			if err != nil {
				return Errorf("%v", err)
			}
			want := []wire.Opcode{wire.RCReadResponseFirst, wire.RCReadResponseMiddle, wire.RCReadResponseLast}
			for i, op := range want {
				r, ok := c.Response(ctx, answerWait)
				if !ok {
					return Failf("response %d of 3 missing", i+1)
				}
				if r.Pkt.Opcode != op || r.PSN() != psnAdd(psn, i) || len(r.Pkt.Payload) != c.MTU {
					return Failf("response %d: want %s psn=%#x %dB, got %s", i+1, op, psnAdd(psn, i), c.MTU, r)
				}
				if (r.Pkt.AETH != nil) == (op == wire.RCReadResponseMiddle) {
					return Failf("response %d: AETH presence wrong: %s", i+1, r)
				}
				if why := msnWrong(r, 1); why != "" {
					return Failf("response %d: %s (one READ, one message)", i+1, why)
				}
			}
			return Passf("FIRST/MIDDLE/LAST psn=%#x..%#x, %d bytes each", psn, psnAdd(psn, 2), c.MTU)
		}})
	add(&Scenario{ID: "R-READ-ZERO", Title: "zero-length READ", Role: PeerResponder,
		Rule: "IBA 9.7.4.1.4 (DMA length 0), C9-87, C9-88", Expect: "READ RESPONSE ONLY without payload, MSN 1: a zero-length READ checks no R_Key (this one's is wrong, its VA 0)",
		Tools: readTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			// A wrong R_Key and VA 0, as R-WRITE-ZERO: with the buffer's
			// own, a responder that checks them anyway passed.
			h := c.Hdr(wire.RCReadRequest)
			h.VA, h.RKey, h.DMALen = 0, c.RKey^0xdead00, 0
			psn := c.next(1)
			if err := c.Send(h, nil, "READ 0 bytes, rkey wrong, VA 0"); err != nil {
				return Errorf("%v", err)
			}
			r, ok := c.Response(ctx, answerWait)
			if !ok || r.Pkt.Opcode != wire.RCReadResponseOnly || r.PSN() != psn || len(r.Pkt.Payload) != 0 {
				if !ok {
					return Failf("no response to a zero-length READ psn=%#x", psn)
				}
				return Failf("want an empty READ_RESPONSE_ONLY psn=%#x, got %s", psn, r)
			}
			if why := msnWrong(r, 1); why != "" {
				return Failf("%s: a zero-length READ is a message too", why)
			}
			return Passf("%s", r)
		}})
	add(&Scenario{ID: "R-WRITE-ZERO", Title: "zero-length WRITE with a bogus R_Key", Role: PeerResponder,
		Rule: "IBA 9.4.4 (zero-length RDMA needs no valid R_Key)", Expect: "ACK: a zero-length WRITE checks no R_Key",
		Tools: writeTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			h := c.Hdr(wire.RCWriteOnly)
			h.VA, h.RKey, h.DMALen, h.AckReq = 0, c.RKey^0xdead00, 0, true
			c.next(1)
			if err := c.Send(h, nil, "WRITE ONLY 0 bytes, rkey wrong"); err != nil {
				return Errorf("%v", err)
			}
			return expectACK(ctx, c, h.PSN, 1, "zero-length WRITE")
		}})
	add(&Scenario{ID: "R-PSN-WRAP", Title: "PSN wraps at 2^24", Role: PeerResponder, Conn: ConnOptions{PSN: 0xfffffe, SetPSN: true},
		Rule: "IBA 9.7.1 (PSN modulo 2^24)", Expect: "requests at 0xfffffe, 0xffffff, 0, 1 all executed; ACK psn=1 MSN 4",
		Tools: []Tool{IBWriteBW, IBReadBW, IBAtomicBW, IBSendBW, IBVRCPingpong},
		Run: func(ctx context.Context, c *Conn) Outcome {
			var outs []Outcome
			for i := range 4 {
				psn, err := c.Probe(fmt.Sprintf("request %d across the wrap", i+1))
				if err != nil {
					return Errorf("%v", err)
				}
				r, ok := c.ResponseTo(ctx, psn, answerWait)
				if !ok {
					return Failf("no response for psn=%#x (request %d of 4)", psn, i+1)
				}
				if r.Pkt.AETH != nil && (r.Syn().Kind() != wire.SynACK || r.MSN() != uint32(i+1)) {
					return Failf("request %d psn=%#x: %s, want ACK MSN %d", i+1, psn, r, i+1)
				}
				if i == 3 {
					outs = append(outs, Passf("last: %s", r))
				}
			}
			return combine(outs...)
		}})
	add(&Scenario{ID: "R-ATOMIC-FETCHADD", Title: "FETCH_ADD returns the original and adds", Role: PeerResponder,
		Rule: "IBA 9.4.5 (atomic ACK carries the original data)", Expect: "ATOMIC ACK orig=X MSN 1, then a second FETCH_ADD sees X+5 (MSN 2)",
		Tools: atomTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			p1, _ := c.Atomic(wire.RCFetchAdd, 8, 5, 0, "FETCH_ADD +5")
			r1, ok := c.ResponseTo(ctx, p1, answerWait)
			if !ok || r1.Pkt.AtomicAckETH == nil {
				return Failf("no ATOMIC ACK for psn=%#x", p1)
			}
			p2, _ := c.Atomic(wire.RCFetchAdd, 8, 0, 0, "FETCH_ADD +0 (reads)")
			r2, ok := c.ResponseTo(ctx, p2, answerWait)
			if !ok || r2.Pkt.AtomicAckETH == nil {
				return Failf("no ATOMIC ACK for psn=%#x", p2)
			}
			x, y := r1.Pkt.AtomicAckETH.OrigData(), r2.Pkt.AtomicAckETH.OrigData()
			if y != x+5 {
				return Failf("first orig=%#x, second orig=%#x, want %#x", x, y, x+5)
			}
			for i, r := range []*Rx{r1, r2} {
				if why := msnWrong(r, uint32(i+1)); why != "" {
					return Failf("FETCH_ADD %d: %s", i+1, why)
				}
			}
			return Passf("%s; %s", r1, r2)
		}})
	add(&Scenario{ID: "R-ATOMIC-CMPSWAP", Title: "COMPARE_SWAP swaps on equality only", Role: PeerResponder,
		Rule: "IBA 9.4.5", Expect: "a matching compare swaps, a mismatching one does not; both return the original, and each atomic counts in the MSN (1..4)",
		Tools: atomTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			msn := uint32(0) // atomics the peer has executed
			badMSN := ""
			count := func(r *Rx) {
				msn++
				if why := msnWrong(r, msn); why != "" && badMSN == "" {
					badMSN = fmt.Sprintf("atomic %d: %s (a mismatching COMPARE_SWAP is a completed message too)", msn, why)
				}
			}
			read := func(note string) (uint64, *Rx, bool) {
				p, _ := c.Atomic(wire.RCFetchAdd, 16, 0, 0, note)
				r, ok := c.ResponseTo(ctx, p, answerWait)
				if !ok || r.Pkt.AtomicAckETH == nil {
					return 0, r, false
				}
				count(r)
				return r.Pkt.AtomicAckETH.OrigData(), r, true
			}
			x, _, ok := read("FETCH_ADD +0 (reads)")
			if !ok {
				return Failf("no ATOMIC ACK for the read")
			}
			p, _ := c.Atomic(wire.RCCompareSwap, 16, 0x1111, x^1, "COMPARE_SWAP, compare mismatches")
			r, ok := c.ResponseTo(ctx, p, answerWait)
			if !ok || r.Pkt.AtomicAckETH == nil || r.Pkt.AtomicAckETH.OrigData() != x {
				return Failf("mismatching COMPARE_SWAP: want orig=%#x, got %v", x, r)
			}
			count(r)
			p, _ = c.Atomic(wire.RCCompareSwap, 16, 0x2222, x, "COMPARE_SWAP, compare matches")
			if r, ok = c.ResponseTo(ctx, p, answerWait); !ok || r.Pkt.AtomicAckETH == nil || r.Pkt.AtomicAckETH.OrigData() != x {
				return Failf("matching COMPARE_SWAP: want orig=%#x, got %v", x, r)
			}
			count(r)
			y, r, ok := read("FETCH_ADD +0 (reads back)")
			if !ok || y != 0x2222 {
				return Failf("after the swap memory holds %#x, want 0x2222 (%v)", y, r)
			}
			if badMSN != "" {
				return Failf("%s", badMSN)
			}
			return Passf("orig %#x, mismatch kept it, match swapped to %#x (%s)", x, y, r)
		}})
	add(&Scenario{ID: "R-WRITE-READBACK", Title: "WRITE then READ returns the bytes written", Role: PeerResponder,
		Rule: "IBA 9.4.3, 9.4.4", Expect: "READ response bytes equal the WRITE's; the READ is message 2 (MSN)", Tools: []Tool{IBWriteBW, IBReadBW},
		Run: func(ctx context.Context, c *Conn) Outcome {
			data := pattern(200, 0x40)
			wp, err := c.WriteOnly(data, 256, true, "WRITE 200 bytes")
			if err != nil {
				return Errorf("%v", err)
			}
			if r, ok := c.ResponseTo(ctx, wp, answerWait); !ok || r.Syn().Kind() != wire.SynACK {
				return Skipf("the peer's memory does not take WRITEs (%v): read-back unreachable", r)
			}
			rp, _ := c.ReadReq(256, 200, "READ them back")
			r, ok := c.ResponseTo(ctx, rp, answerWait)
			if !ok || r.Pkt.Opcode != wire.RCReadResponseOnly {
				if ok && r.Syn().Kind() == wire.SynNAK {
					return Skipf("the peer's memory does not allow READs (%s): read-back unreachable", r)
				}
				return Failf("no READ response (%v)", r)
			}
			if !bytes.Equal(r.Pkt.Payload, data) {
				return Failf("READ returned different bytes than written (%s)", r)
			}
			if why := msnWrong(r, 2); why != "" {
				return Failf("%s: the WRITE and the READ are two messages", why)
			}
			return Passf("%s matches the WRITE", r)
		}})
}

// rcWriteOrSend are tools where 5 small messages are all executed.
var rcWriteOrSend = []Tool{IBWriteBW, IBSendBW, IBVRCPingpong}
