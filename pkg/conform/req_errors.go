package conform

import (
	"context"

	"github.com/rxed/rxed/pkg/wire"
)

// Requester scenarios: responses that end the request with an error (IBA
// 9.7.5.2.3-9.7.5.2.5 fatal NAKs, 9.9 requester-side errors: bad or
// unexpected responses).

func init() {
	fatal := func(id, title, rule string, code uint8) {
		add(&Scenario{ID: id, Title: title, Role: PeerRequester, Rule: rule, Tools: reqTools,
			Expect: "no retransmission; the request completes in error and the QP enters the error state (the tool reports it)",
			Run: func(ctx context.Context, c *Conn) Outcome {
				r, o, ok := c.firstRequest(ctx)
				if !ok {
					return o
				}
				_ = c.SendNAK(r.PSN(), code, "NAK "+wire.NAKCodeName(code))
				return c.judgeFatalNAK(ctx, r, code)
			}})
	}
	fatal("Q-NAK-RKEY", "NAK remote access error (R_Key violation)", "IBA 9.7.5.2.3 (remote access error), 9.9.2 (Remote Access Error completion)", wire.NAKRemoteAccess)
	fatal("Q-NAK-REMOTE-OP", "NAK remote operational error", "IBA 9.7.5.2.5 (remote operational error), 9.9.2", wire.NAKRemoteOp)
	fatal("Q-NAK-INVALID", "NAK invalid request", "IBA 9.7.5.2.4 (invalid request), 9.9.2", wire.NAKInvalidRequest)

	bad := func(id, title, expect string, send func(c *Conn, r *Rx) string) {
		add(&Scenario{ID: id, Title: title, Role: PeerRequester, Rule: "IBA 9.9.2 (requester: bad response / unexpected opcode)", Tools: reqTools,
			Expect: expect,
			Run: func(ctx context.Context, c *Conn) Outcome {
				r, o, ok := c.firstRequest(ctx)
				if !ok {
					return o
				}
				what := send(c, r)
				return c.judgeEnded(ctx, r.PSN(), what, true)
			}})
	}
	bad("Q-BAD-RESPONSE", "an ACK with a reserved AETH syndrome", "not taken as an ACK: either dropped (the request is resent) or the request fails with a bad-response error",
		func(c *Conn, r *Rx) string {
			_ = c.sendAETH(wire.RCAck, r.PSN(), wire.Syndrome(0x40), c.MSN(), "AETH syndrome 0x40 (reserved kind)")
			return "ACK with reserved syndrome 0x40"
		})
	bad("Q-UNEXPECTED-OPCODE", "a response of the wrong kind for the request", "not taken as the request's response: dropped (resent) or a bad-response error",
		func(c *Conn, r *Rx) string {
			if r.Pkt.Info.Flags&wire.FlagRead != 0 {
				_ = c.AtomicAck(r.PSN(), 0, "ATOMIC ACK answering a READ")
				return "ATOMIC ACK for a READ"
			}
			h := wire.Headers{Opcode: wire.RCReadResponseOnly, PKey: DefaultPKey, DestQP: c.PeerQPN, PSN: r.PSN(),
				Syndrome: wire.ACKSyndrome(0x1f), MSN: c.MSN() + 1}
			_ = c.Send(h, readData(0, 8), "READ RESPONSE ONLY answering a "+r.Pkt.Opcode.String())
			return "READ RESPONSE ONLY for a " + r.Pkt.Opcode.String()
		})
}
