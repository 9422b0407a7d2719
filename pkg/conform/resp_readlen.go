package conform

import (
	"context"

	"github.com/rxed/rxed/pkg/wire"
)

// Malformed RDMA READ requests: a READ REQUEST is BTH and RETH alone, no
// payload and so no pad. One whose length does not add up (PadCnt != 0;
// bytes between the RETH and the ICRC) is no valid request: a receiver
// drops it as malformed (rxed's parser; the corpus's bad_padding and
// bad_length, shared/conformance/invalid.jsonl v4_padcnt2_read_request,
// v6_read_request_extra_8) or refuses it as a length error with NAK
// invalid request (IBA 9.7.5.2.4, as it refuses a WRITE whose payload does
// not match its length). Executing it is wrong: the responder took a
// request whose length it never checked. rdma_rxe does execute both: its
// receive checks only a lower bound (rxe_recv.c rxe_rcv: skb->len <
// header_size(pkt)), its ICRC covers the bytes whatever PadCnt says
// (payload_size + bth_pad), and rxe_resp.c checks lengths only of opcodes
// with a payload (rxe_resp_check_length: pkt->mask & RXE_PAYLOAD_MASK, which
// a READ REQUEST's mask lacks; a stub in 6.1's check_length), so it sends
// the READ's response.

func init() {
	readLen := func(id, title, rule string, mangle func(c *Conn) ([]byte, string)) {
		add(&Scenario{ID: id, Title: title, Role: PeerResponder, Rule: rule,
			Expect: "silently dropped (the valid READ after it is answered, MSN 1) or NAK invalid request for its PSN, MSN 0; never executed",
			Tools:  readTools,
			Run: func(ctx context.Context, c *Conn) Outcome {
				b, note := mangle(c)
				if b == nil {
					return Errorf("could not build the packet")
				}
				return droppedOrLengthError(ctx, c, b, wire.BTH(b).PSN(), note)
			}})
	}
	// A valid 8-byte READ of the peer's buffer, built at our PSN (which
	// does not advance: a dropped request is no request).
	read := func(c *Conn) []byte {
		h, _ := c.ProbeHeaders()
		b, _ := c.Build(h, nil)
		return b
	}
	readLen("D-READ-PAD", "READ REQUEST with a pad count", "IBA 9.2 (PadCnt pads a payload; a READ REQUEST has none), 9.7.5.2.4 (length error)",
		func(c *Conn) ([]byte, string) {
			b := read(c)
			if b == nil {
				return nil, ""
			}
			wire.BTH(b).SetPadCount(2)
			c.Reseal(b)
			return b, "READ REQUEST 8 bytes with PadCnt 2"
		})
	readLen("D-READ-EXTRA", "READ REQUEST with bytes after its RETH", "IBA 9.4 (a READ REQUEST is BTH+RETH, no payload), 9.7.5.2.4 (length error)",
		func(c *Conn) ([]byte, string) {
			b := read(c)
			if b == nil {
				return nil, ""
			}
			n := len(b) - wire.ICRCLen
			b = append(b[:n:n], make([]byte, 8+wire.ICRCLen)...) // 8 zero bytes, then the ICRC slot
			c.Reseal(b)
			return b, "READ REQUEST 8 bytes with 8 bytes after its RETH"
		})
}

// droppedOrLengthError sends bad, a malformed request at psn, and wants it
// either silently dropped (the peer then serves the valid probe as its
// first message) or refused with NAK invalid request at psn carrying MSN 0;
// a READ response, or anything else, FAILs.
func droppedOrLengthError(ctx context.Context, c *Conn, bad []byte, psn uint32, note string) Outcome {
	if err := c.SendRaw(bad, note); err != nil {
		return Errorf("send: %v", err)
	}
	got := c.Collect(ctx, silenceWait, c.IsResponse)
	if len(got) == 0 {
		ev, ok := c.ProbeAnswered(ctx, 1)
		if !ok {
			return Failf("%s was dropped, but the peer stopped serving: %s", note, ev)
		}
		return Passf("%s: silently dropped; then %s", note, ev)
	}
	r := got[0]
	switch {
	case r.Syn().Kind() == wire.SynNAK && r.Syn().NAKCode() == wire.NAKInvalidRequest && r.PSN() == psn:
		if why := msnWrong(r, 0); why != "" {
			return Failf("%s: %s (a refused request completes nothing)", note, why)
		}
		return Passf("%s: refused as a length error: %s", note, r)
	case isReadResponse(r.Pkt.Opcode):
		return Failf("%s was executed: the peer answered %s (a READ REQUEST has no payload and no pad; its length was not checked)", note, r)
	}
	return Failf("%s: the peer answered %s, want silence or NAK(invalid request) psn=%#x", note, r, psn)
}

// isReadResponse reports whether op is one of the RC READ responses.
func isReadResponse(op wire.Opcode) bool {
	switch op {
	case wire.RCReadResponseFirst, wire.RCReadResponseMiddle, wire.RCReadResponseLast, wire.RCReadResponseOnly:
		return true
	}
	return false
}
