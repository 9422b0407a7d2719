package conform

import (
	"context"
	"fmt"
	"time"

	"github.com/rxed/rxed/pkg/wire"
)

// Requester scenarios: how the peer's requester takes acknowledgements
// (IBA 9.7.6: response validation, coalesced ACKs, implied NAKs,
// duplicate and ghost responses).

func init() {
	add(&Scenario{ID: "Q-RUN", Title: "a conformant responder: the peer's run completes", Role: PeerRequester,
		Rule: "IBA 9.7.5.1, 9.7.6 (baseline)", Expect: "every request answered in order; the tool finishes its run (perftest: its closing exchange)",
		Tools: reqTools, Run: runClean})

	add(&Scenario{ID: "Q-GHOST-ACK", Title: "an ACK for a PSN never sent is ignored", Role: PeerRequester,
		Rule: "IBA 9.7.6.1 (response PSN outside the outstanding window)", Expect: "the ghost ACK completes nothing: the request is retransmitted after the local ACK timeout",
		Tools: ackTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			r, o, ok := c.firstRequest(ctx)
			if !ok {
				return o
			}
			ghost := psnAdd(r.PSN(), 0x10000)
			_ = c.sendAETH(wire.RCAck, ghost, wire.ACKSyndrome(0x1f), c.MSN()+64, "ghost ACK: a PSN the peer never sent")
			again, ok := c.awaitRequest(ctx, 0, samePSN(r.PSN()))
			if !ok {
				return Failf("ghost ACK psn=%#x taken as an acknowledgement: psn=%#x was not retransmitted within %v (%s)", ghost, r.PSN(), c.patience(), c.qpParams())
			}
			c.Serve(again)
			return Passf("ghost ACK psn=%#x ignored: %s retransmitted %v later (%s)", ghost, again, (again.At - r.At).Round(time.Millisecond), c.qpParams())
		}})

	add(&Scenario{ID: "Q-ACK-COALESCE", Title: "one ACK completes several messages", Role: PeerRequester,
		Rule: "IBA 9.7.5.1.1 (coalesced ACKs), 9.7.6", Expect: "no message the ACK covers is retransmitted; the run completes",
		Tools: pipeTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			r, o, ok := c.firstRequest(ctx)
			if !ok {
				return o
			}
			c.Absorb(r)
			lastEnd, msgs := uint32(0), 0
			if endsMessage(r) {
				lastEnd, msgs = r.PSN(), 1
			}
			deadline := c.deadline(c.ackTimeout() / 3)
			for msgs < 4 && c.left(deadline) > 0 {
				x, ok := c.NextRequest(ctx, c.left(deadline))
				if !ok {
					break
				}
				if x.PSN() != c.EPSN() {
					continue
				}
				c.Absorb(x)
				if endsMessage(x) {
					lastEnd, msgs = x.PSN(), msgs+1
				}
			}
			if msgs < 2 {
				return Skipf("the peer had %d message(s) outstanding within %v: nothing to coalesce", msgs, c.ackTimeout()/3)
			}
			// The responder state counts every absorbed message; one ACK
			// covers the ones that ended by lastEnd.
			_ = c.SendACK(lastEnd, fmt.Sprintf("one ACK for %d messages", msgs))
			first := r.PSN()
			got := c.Collect(ctx, 2*c.ackTimeout()+50*time.Millisecond, func(x *Rx) bool {
				return c.IsRequest(x) && !psnBefore(lastEnd, x.PSN())
			})
			for _, x := range got {
				if !psnBefore(x.PSN(), first) {
					return Failf("coalesced ACK psn=%#x (%d messages) did not complete them: %s retransmitted", lastEnd, msgs, x)
				}
			}
			return Passf("ACK psn=%#x completed %d messages psn=%#x..%#x: none retransmitted in %v", lastEnd, msgs, first, lastEnd, 2*c.ackTimeout())
		}})

	stale := func(id, title, expect string, tools []Tool, send func(c *Conn, old uint32, oldMSN uint32) string) {
		add(&Scenario{ID: id, Title: title, Role: PeerRequester, Rule: "IBA 9.7.6.1 (duplicate and stale responses)", Expect: expect, Tools: tools,
			Run: func(ctx context.Context, c *Conn) Outcome {
				r, o, ok := c.firstRequest(ctx)
				if !ok {
					return o
				}
				// Answer until the first message is complete and answered;
				// its last response PSN is then behind the peer's window.
				c.Serve(r)
				for c.MSN() < 1 {
					x, ok := c.NextRequest(ctx, 2*time.Second)
					if !ok {
						return Errorf("the peer's first message did not complete")
					}
					c.Serve(x)
				}
				old := c.srv.lastResp
				next, ok := c.Next(ctx, 2*time.Second, func(x *Rx) bool { return c.IsRequest(x) && psnBefore(old, x.PSN()) })
				if !ok {
					return Skipf("the peer sent one message only: no later state to disturb")
				}
				what := send(c, old, 1)
				c.Serve(next)
				if err := c.ServeToEnd(ctx); err != nil {
					return Failf("after %s the run did not complete: %v", what, err)
				}
				return Passf("%s ignored: the run completed (%d messages)", what, c.MSN())
			}})
	}
	stale("Q-STALE-ACK", "a duplicate ACK for a completed message is ignored", "the old ACK changes nothing; the run completes", ackTools,
		func(c *Conn, old, msn uint32) string {
			_ = c.sendAETH(wire.RCAck, old, wire.ACKSyndrome(0x1f), msn, "duplicate ACK of the first message")
			_ = c.sendAETH(wire.RCAck, psnAdd(old, -1), wire.ACKSyndrome(0x1f), 0, "stale ACK: before the first message")
			return fmt.Sprintf("duplicate ACK psn=%#x and stale ACK psn=%#x", old, psnAdd(old, -1))
		})
	stale("Q-STALE-NAK", "a NAK for a completed message is ignored", "a remote access NAK naming an old PSN fails nothing; the run completes", reqTools,
		func(c *Conn, old, msn uint32) string {
			_ = c.sendAETH(wire.RCAck, old, wire.NAKSyndrome(wire.NAKRemoteAccess), msn, "stale NAK: remote access error for the completed first message")
			return fmt.Sprintf("stale NAK(remote access) psn=%#x", old)
		})
	stale("Q-DUP-READ-RESP", "a duplicate READ response is ignored", "the first READ's response sent again changes nothing; the run completes", readTools,
		func(c *Conn, old, msn uint32) string {
			rd := c.srv.reads[0]
			c.ReadResponse(rd.psn, rd.va, rd.n, 0, -1, "duplicate READ response")
			return fmt.Sprintf("the READ response psn=%#x sent again", old)
		})

	add(&Scenario{ID: "Q-IMPLIED-NAK", Title: "a later READ's response implies the earlier one was lost", Role: PeerRequester,
		Rule: "IBA 9.7.6.1 (implied NAK: responses must arrive in order)", Expect: "the unanswered earlier READ is requested again (go-back to its PSN), not completed",
		Tools: readTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			r1, o, ok := c.firstRequest(ctx)
			if !ok {
				return o
			}
			r2, ok := c.Next(ctx, c.ackTimeout()/3, func(x *Rx) bool { return c.IsRequest(x) && x.PSN() == psnAdd(r1.PSN(), c.reqPackets(r1)) })
			if !ok {
				return Skipf("the peer had one READ outstanding: no later response to send (its -o / tx depth)")
			}
			c.Absorb(r1)
			c.Absorb(r2)
			c.ReadResponse(r2.PSN(), r2.Pkt.RETH.VA(), int(r2.Pkt.RETH.DMALen()), 0, -1, "response to the second READ only")
			at := c.Since()
			again, ok := c.awaitRequest(ctx, 0, samePSN(r1.PSN()))
			if !ok {
				return Failf("READ psn=%#x never requested again within %v after the response to psn=%#x: taken as complete (%s)", r1.PSN(), c.patience(), r2.PSN(), c.qpParams())
			}
			c.Serve(again)
			how := "on the implied NAK"
			if again.At-at >= c.ackTimeout()-time.Millisecond {
				how = "only after its local ACK timer"
			}
			return Passf("READ psn=%#x requested again %v after the later response (%s): %s", r1.PSN(), (again.At - at).Round(100*time.Microsecond), how, again)
		}})
}

// runClean answers everything as a conformant responder and requires the
// tool to finish its run.
func runClean(ctx context.Context, c *Conn) Outcome {
	r, o, ok := c.firstRequest(ctx)
	if !ok {
		return o
	}
	c.Serve(r)
	if err := c.ServeToEnd(ctx); err != nil {
		return Failf("%v", err)
	}
	if c.ToolReportsEnd() {
		return Passf("the tool finished its run and closing exchange: %d messages answered", c.MSN())
	}
	return Passf("%d messages answered in order (the tool's iterations)", c.MSN())
}
