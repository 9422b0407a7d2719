package conform

import (
	"context"
	"fmt"

	"github.com/rxed/rxed/pkg/wire"
)

// Responder scenarios: requests the responder must refuse with a NAK
// (IBA 9.7.5.2.3 remote access errors, 9.7.5.2.4 invalid requests,
// 9.7.5.2.8 RNR).

func init() {
	badKey := func(id, title string, tools []Tool, send func(c *Conn) (uint32, error)) {
		add(&Scenario{ID: id, Title: title, Role: PeerResponder, Rule: "IBA 9.7.5.2.3 (R_Key violation)",
			Expect: "NAK remote access error for the request's PSN, MSN 0 (nothing completed)", Tools: tools,
			Run: func(ctx context.Context, c *Conn) Outcome {
				psn, err := send(c)
				if err != nil {
					return Errorf("%v", err)
				}
				return expectNAK(ctx, c, psn, wire.NAKRemoteAccess, 0, title)
			}})
	}
	badKey("R-RKEY-WRITE", "WRITE with a wrong R_Key", writeTools, func(c *Conn) (uint32, error) {
		c.RKey ^= 0x5a5a00
		return c.WriteOnly(pattern(16, 1), 0, true, "WRITE, wrong rkey")
	})
	badKey("R-RKEY-READ", "READ with a wrong R_Key", readTools, func(c *Conn) (uint32, error) {
		c.RKey ^= 0x5a5a00
		return c.ReadReq(0, 16, "READ, wrong rkey")
	})
	badKey("R-RKEY-ATOMIC", "atomic with a wrong R_Key", atomTools, func(c *Conn) (uint32, error) {
		c.RKey ^= 0x5a5a00
		return c.Atomic(wire.RCFetchAdd, 0, 1, 0, "FETCH_ADD, wrong rkey")
	})
	badKey("R-BOUNDS-WRITE", "WRITE beyond any buffer", writeTools, func(c *Conn) (uint32, error) {
		return c.WriteOnly(pattern(128, 1), 1<<40, true, "WRITE at VA+2^40")
	})
	badKey("R-BOUNDS-READ", "READ beyond any buffer", readTools, func(c *Conn) (uint32, error) {
		return c.ReadReq(1<<40, 16, "READ at VA+2^40")
	})
	badKey("R-BOUNDS-ATOMIC", "atomic beyond any buffer", atomTools, func(c *Conn) (uint32, error) {
		return c.Atomic(wire.RCFetchAdd, 1<<40, 1, 0, "FETCH_ADD at VA+2^40")
	})
	add(&Scenario{ID: "R-ACCESS-MISSING", Title: "an operation the peer's memory does not grant", Role: PeerResponder,
		Rule: "IBA 9.7.5.2.3 (access rights), 10.6.3.1", Expect: "NAK remote access error (rdma_rxe answers a QP-level refusal with invalid request: DEVIATION)",
		Tools: rdmaTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			var psn uint32
			var what string
			switch c.Tool {
			case IBWriteBW:
				what = "READ to ib_write_bw's buffer"
				psn, _ = c.ReadReq(0, 16, what)
			default:
				what = "WRITE to " + string(c.Tool) + "'s buffer"
				psn, _ = c.WriteOnly(pattern(16, 1), 0, true, what)
			}
			r, ok := c.Response(ctx, answerWait)
			switch {
			case !ok:
				return Failf("%s: no response", what)
			case r.Syn().Kind() == wire.SynNAK && msnWrong(r, 0) != "":
				return Failf("%s: %s (a NAK counts the messages completed before it)", what, msnWrong(r, 0))
			case r.Syn().Kind() == wire.SynNAK && r.Syn().NAKCode() == wire.NAKRemoteAccess && r.PSN() == psn:
				return Passf("%s: %s", what, r)
			case r.Syn().Kind() == wire.SynNAK && r.Syn().NAKCode() == wire.NAKInvalidRequest && r.PSN() == psn:
				return Deviationf("%s: %s (QP access flags refused it; IBA names remote access error)", what, r)
			case r.Syn().Kind() == wire.SynACK:
				return Skipf("%s was executed (%s): the peer's memory grants it, so the case is unreachable with this server", what, r)
			}
			return Failf("%s: %s", what, r)
		}})
	add(&Scenario{ID: "R-RNR-NO-RECV", Title: "a SEND without a posted receive gets RNR NAK", Role: PeerResponder,
		Rule: "IBA 9.7.5.2.8 (RNR NAK with the responder's timer)", Expect: "RNR NAK for the SEND's PSN with the min_rnr_timer value and MSN 0; the PSN is not consumed (the probe at it completes message 1)",
		Tools: rdmaTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			h := c.Hdr(wire.RCSendOnly)
			h.AckReq = true
			if err := c.Send(h, pattern(8, 1), "SEND (the RDMA tool posts no receive)"); err != nil {
				return Errorf("%v", err)
			}
			r, ok := c.Response(ctx, answerWait)
			switch {
			case !ok:
				return Failf("no response to a SEND without receive")
			case r.Syn().Kind() != wire.SynRNR || r.PSN() != h.PSN:
				return Failf("want RNR NAK psn=%#x, got %s", h.PSN, r)
			case msnWrong(r, 0) != "":
				return Failf("%s: the SEND it refuses is no completed message", msnWrong(r, 0))
			}
			ev, ok := c.ProbeAnswered(ctx, 1)
			if !ok {
				return Failf("RNR %s, but then %s (the RNR'ed PSN must not be consumed)", r, ev)
			}
			return Passf("%s, timer %d; the same PSN then %s", r, r.Syn().RNRTimer(), ev)
		}})
	add(&Scenario{ID: "R-RNR-WRITE-IMM", Title: "WRITE with immediate consumes a receive: RNR without one", Role: PeerResponder,
		Rule: "IBA 9.4.4 (immediate data consumes a receive WQE), 9.7.5.2.8", Expect: "RNR NAK for the WRITE ONLY WITH IMMEDIATE, MSN 0",
		Tools: writeTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			h := c.Hdr(wire.RCWriteOnlyImm)
			h.VA, h.RKey, h.DMALen, h.AckReq, h.Imm = c.VA, c.RKey, 8, true, 0x12345678
			_ = c.Send(h, pattern(8, 1), "WRITE_ONLY_WITH_IMMEDIATE, no receive posted")
			r, ok := c.Response(ctx, answerWait)
			if !ok || r.Syn().Kind() != wire.SynRNR || r.PSN() != h.PSN {
				if !ok {
					return Failf("no response")
				}
				return Failf("want RNR NAK psn=%#x, got %s", h.PSN, r)
			}
			if why := msnWrong(r, 0); why != "" {
				return Failf("%s: the WRITE it refuses is no completed message", why)
			}
			return Passf("%s", r)
		}})
	inval := func(id, title, rule string, tools []Tool, script func(c *Conn) (uint32, error)) {
		add(&Scenario{ID: id, Title: title, Role: PeerResponder, Rule: rule,
			Expect: "NAK invalid request for the offending PSN, MSN 0 (nothing completed)", Tools: tools,
			Run: func(ctx context.Context, c *Conn) Outcome {
				psn, err := script(c)
				if err != nil {
					return Errorf("%v", err)
				}
				return expectNAK(ctx, c, psn, wire.NAKInvalidRequest, 0, title)
			}})
	}
	send := func(c *Conn, h wire.Headers, n int, note string) error {
		c.next(1)
		return c.Send(h, pattern(n, 7), note)
	}
	inval("R-OPSEQ-WMIDDLE", "WRITE MIDDLE without FIRST", "IBA 9.7.5.2.4 (opcode sequence), C9-99", writeTools, func(c *Conn) (uint32, error) {
		h := c.Hdr(wire.RCWriteMiddle)
		return h.PSN, send(c, h, c.MTU, "WRITE MIDDLE, no FIRST")
	})
	inval("R-OPSEQ-WFIRST2", "WRITE FIRST after FIRST", "IBA 9.7.5.2.4, C9-99", writeTools, func(c *Conn) (uint32, error) {
		h := c.Hdr(wire.RCWriteFirst)
		h.VA, h.RKey, h.DMALen = c.VA, c.RKey, uint32(3*c.MTU)
		_ = send(c, h, c.MTU, "WRITE FIRST")
		h.PSN = c.PSN
		return h.PSN, send(c, h, c.MTU, "WRITE FIRST again")
	})
	inval("R-OPSEQ-WLAST-LEN", "WRITE LAST whose total differs from the DMA length", "IBA 9.7.5.2.4 (length error)", writeTools, func(c *Conn) (uint32, error) {
		h := c.Hdr(wire.RCWriteFirst)
		h.VA, h.RKey, h.DMALen = c.VA, c.RKey, uint32(2*c.MTU)
		_ = send(c, h, c.MTU, "WRITE FIRST, DMA length 2 PMTU")
		l := c.Hdr(wire.RCWriteLast)
		l.AckReq = true
		return l.PSN, send(c, l, 16, "WRITE LAST with 16 bytes (total short)")
	})
	inval("R-WONLY-LEN", "WRITE ONLY with payload shorter than its DMA length", "IBA 9.7.5.2.4 (length error)", writeTools, func(c *Conn) (uint32, error) {
		h := c.Hdr(wire.RCWriteOnly)
		h.VA, h.RKey, h.DMALen, h.AckReq = c.VA, c.RKey, 64, true
		return h.PSN, send(c, h, 32, "WRITE ONLY, DMA length 64, payload 32")
	})
	inval("R-WMIDDLE-SHORT", "WRITE MIDDLE shorter than the PMTU", "IBA 9.7.5.2.4 (FIRST/MIDDLE carry exactly PMTU)", writeTools, func(c *Conn) (uint32, error) {
		h := c.Hdr(wire.RCWriteFirst)
		h.VA, h.RKey, h.DMALen = c.VA, c.RKey, uint32(3*c.MTU)
		_ = send(c, h, c.MTU, "WRITE FIRST")
		m := c.Hdr(wire.RCWriteMiddle)
		return m.PSN, send(c, m, c.MTU/2, "WRITE MIDDLE with half a PMTU")
	})
	inval("R-WRITE-OVER-PMTU", "WRITE ONLY with more than the PMTU", "IBA 9.7.5.2.4 (packet longer than PMTU)", writeTools, func(c *Conn) (uint32, error) {
		h := c.Hdr(wire.RCWriteOnly)
		h.VA, h.RKey, h.DMALen, h.AckReq = c.VA, c.RKey, uint32(c.MTU+64), true
		return h.PSN, send(c, h, c.MTU+64, "WRITE ONLY PMTU+64 bytes")
	})
	inval("R-OPSEQ-SMIDDLE", "SEND MIDDLE without FIRST", "IBA 9.7.5.2.4, C9-99", sendTools, func(c *Conn) (uint32, error) {
		h := c.Hdr(wire.RCSendMiddle)
		return h.PSN, send(c, h, c.MTU, "SEND MIDDLE, no FIRST")
	})
	inval("R-OPSEQ-SFIRST2", "SEND FIRST after FIRST", "IBA 9.7.5.2.4, C9-99", sendTools, func(c *Conn) (uint32, error) {
		h := c.Hdr(wire.RCSendFirst)
		_ = send(c, h, c.MTU, "SEND FIRST")
		h.PSN = c.PSN
		return h.PSN, send(c, h, c.MTU, "SEND FIRST again")
	})
	inval("R-OPSEQ-SLAST", "SEND LAST without FIRST", "IBA 9.7.5.2.4, C9-99", sendTools, func(c *Conn) (uint32, error) {
		h := c.Hdr(wire.RCSendLast)
		h.AckReq = true
		return h.PSN, send(c, h, 16, "SEND LAST, no FIRST")
	})
	inval("R-SEND-OVER-PMTU", "SEND ONLY with more than the PMTU", "IBA 9.7.5.2.4 (packet longer than PMTU)", sendTools, func(c *Conn) (uint32, error) {
		h := c.Hdr(wire.RCSendOnly)
		h.AckReq = true
		return h.PSN, send(c, h, c.MTU+64, "SEND ONLY PMTU+64 bytes")
	})
	inval("R-OPSEQ-WRITE-IN-SEND", "WRITE FIRST inside a multi-packet SEND", "IBA 9.7.5.2.4, C9-99", sendTools, func(c *Conn) (uint32, error) {
		h := c.Hdr(wire.RCSendFirst)
		_ = send(c, h, c.MTU, "SEND FIRST")
		w := c.Hdr(wire.RCWriteOnly)
		w.DMALen, w.AckReq = 0, true
		return w.PSN, send(c, w, 0, "WRITE ONLY before the SEND's LAST")
	})
	inval("R-ATOMIC-UNALIGNED", "atomic at an address not 8-byte aligned", "IBA 9.4.5 (atomics are naturally aligned)", atomTools, func(c *Conn) (uint32, error) {
		return c.Atomic(wire.RCFetchAdd, 4, 1, 0, "FETCH_ADD at VA+4")
	})
	add(&Scenario{ID: "R-READ-OUTSTANDING", Title: "more outstanding READs than the responder's depth", Role: PeerResponder,
		Rule: "IBA 9.7.5.2.4 (responder resources exceeded)", Expect: "NAK invalid request past the announced depth; answering all (resources recycled as answered) is a DEVIATION",
		Tools: readTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			depth := max(c.PeerOutReads, 1)
			n := depth + 1
			first := c.PSN
			for i := range n {
				if _, err := c.ReadReq(uint64(i%64)*8, 8, fmt.Sprintf("READ %d of %d, unacknowledged", i+1, n)); err != nil {
					return Errorf("%v", err)
				}
			}
			// n packets are awaited (n-1 responses and a NAK, or n
			// responses), each within answerWait of the one before: a
			// slow peer answers late, not wrongly.
			got := c.responses(ctx, n, silenceWait)
			answered := 0
			for _, r := range got {
				if r.Syn().Kind() == wire.SynNAK {
					if why := msnWrong(r, uint32(depth)); why != "" {
						return Failf("after %d answers: %s (the %d READs accepted before it)", answered, why, depth)
					}
					if r.Syn().NAKCode() == wire.NAKInvalidRequest && r.PSN() == psnAdd(first, depth) {
						return Passf("%d READs answered, then %s", answered, r)
					}
					return Failf("after %d answers: %s (want NAK invalid request psn=%#x)", answered, r, psnAdd(first, depth))
				}
				if r.Pkt.Opcode == wire.RCReadResponseOnly {
					answered++
					// A READ counts once it is accepted (C9-148): a
					// responder that accepts ahead of its answers may carry
					// a later count, never an earlier one, nor one beyond
					// the READs sent.
					if m := r.MSN(); m < uint32(answered) || m > uint32(n) {
						return Failf("READ %d of %d: %s carries MSN %d, want %d..%d (each READ counts once)", answered, n, r, m, answered, n)
					}
				}
			}
			if answered == n {
				return Deviationf("all %d READs answered with a depth of %d announced: the responder frees a resource per answer", n, depth)
			}
			return Failf("%d of %d READs answered, no NAK", answered, n)
		}})
}
