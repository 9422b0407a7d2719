package conform

import (
	"context"
	"fmt"
	"time"

	"github.com/rxed/rxed/pkg/wire"
)

// Requester scenarios: retransmission (IBA 9.7.6.1.3 local ACK timeout and
// retry_cnt, 9.7.5.2.8 / 9.7.6 RNR NAK and rnr_retry, 9.7.5.2.2 / 9.7.6
// NAK sequence error and go-back-N, partial responses).

// rnrTimerUsec is IBA's RNR timer encoding (Table "Encoding for RNR NAK
// Timer Field"): code -> microseconds.
var rnrTimerUsec = [32]uint32{655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520}

func rnrDelay(code uint8) time.Duration {
	return time.Duration(rnrTimerUsec[code&31]) * time.Microsecond
}

// retryJudge compares the retries seen with the peer's limit.
func retryJudge(c *Conn, retries, limit int, what string, more bool) Outcome {
	switch {
	case retries == limit:
		return Passf("%s: %d retries, the limit, then none (%s)", what, retries, c.qpParams())
	case retries < limit:
		return Failf("%s: the peer gave up after %d retries; its limit is %d (%s)", what, retries, limit, c.qpParams())
	case more:
		return Deviationf("%s: the peer kept retrying past its limit of %d (%d retries seen before the scenario stopped; %s)", what, limit, retries, c.qpParams())
	}
	return Failf("%s: %d retries, more than the limit %d (%s)", what, retries, limit, c.qpParams())
}

func init() {
	add(&Scenario{ID: "Q-TIMEOUT-RETRY", Title: "ACKs withheld: retransmitted after the local ACK timeout", Role: PeerRequester,
		Rule: "IBA 9.7.6.1.3 (Local ACK Timeout, retry_cnt not exceeded)", Expect: "the request is resent every 4.096 us x 2^timeout (at most 4x that) and completes once answered before retry_cnt is used up",
		Tools: reqTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			r, o, ok := c.firstRequest(ctx)
			if !ok {
				return o
			}
			k := min(3, c.Cfg.PeerRetry)
			s := c.watchPSN(ctx, r.PSN(), r, c.patience(), k+1, nil)
			if s.n() < k+1 {
				return Failf("psn=%#x sent %d times, want %d retransmissions before answering (gaps %s, then none for %v; %s)", r.PSN(), s.n(), k, fmtDurs(s.gaps()), c.patience(), c.qpParams())
			}
			c.Serve(s.pkt[s.n()-1])
			if !c.timersOK(s) {
				return Failf("retransmission intervals %s: %s (%s)", fmtDurs(s.gaps()), c.timerRule(), c.qpParams())
			}
			if err := c.ServeToEnd(ctx); err != nil {
				return Failf("answered after %d retransmissions, but the run did not complete: %v", k, err)
			}
			return Passf("psn=%#x resent %d times at intervals %s (T=%v); answered, the run completed", r.PSN(), k, fmtDurs(s.gaps()), c.ackTimeout())
		}})
	add(&Scenario{ID: "Q-TIMEOUT-EXCEEDED", Title: "ACKs withheld: retry_cnt retransmissions, then the QP fails", Role: PeerRequester,
		Rule: "IBA 9.7.6.1.3 (retry_cnt exceeded: Retry Exceeded error)", Expect: "exactly retry_cnt retransmissions at the timeout's interval, then none",
		Tools: reqTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			r, o, ok := c.firstRequest(ctx)
			if !ok {
				return o
			}
			// Up to retry_cnt retransmissions with patience (a late one is
			// not a peer that gave up), then the usual quiet window for
			// one too many.
			s := c.watchPSN(ctx, r.PSN(), r, c.patience(), c.Cfg.PeerRetry+1, nil)
			if s.n() == c.Cfg.PeerRetry+1 {
				extra := c.watchPSN(ctx, r.PSN(), nil, c.quietFor(), 3, nil)
				s.at, s.pkt = append(s.at, extra.at...), append(s.pkt, extra.pkt...)
			}
			c.MarkBroken()
			out := retryJudge(c, s.n()-1, c.Cfg.PeerRetry, fmt.Sprintf("psn=%#x, nothing answered", r.PSN()), s.n() == c.Cfg.PeerRetry+4)
			if out.Verdict != Pass {
				return out
			}
			if !c.timersOK(s) {
				return Failf("retransmission intervals %s: %s", fmtDurs(s.gaps()), c.timerRule())
			}
			return Passf("%s; intervals %s", out.Evidence, fmtDurs(s.gaps()))
		}})
	add(&Scenario{ID: "Q-RETRY-REPORTED", Title: "retry exhaustion is reported by the peer's tool", Role: PeerRequester,
		Rule: "IBA 9.7.6.1.3, 11.6.2 (Retry Exceeded completion)", Expect: "with nothing answered the tool ends with an error (it gives up its exchange), not a clean finish",
		Tools: []Tool{IBWriteBW, IBReadBW, IBAtomicBW, IBSendBW},
		Run: func(ctx context.Context, c *Conn) Outcome {
			r, o, ok := c.firstRequest(ctx)
			if !ok {
				return o
			}
			c.MarkBroken()
			bound := time.Duration(c.Cfg.PeerRetry+2)*4*c.ackTimeout() + 3*time.Second
			err, ended := c.ToolEnded(ctx, bound)
			switch {
			case !ended:
				return Failf("nothing answered since psn=%#x, and the tool had not ended after %v (%s)", r.PSN(), bound, c.qpParams())
			case err == nil:
				return Failf("nothing answered since psn=%#x, yet the tool made its closing exchange as if its run had completed", r.PSN())
			}
			return Passf("nothing answered since psn=%#x: the tool ended without its closing exchange (%s)", r.PSN(), shortErr(err))
		}})

	add(&Scenario{ID: "Q-RNR-TIMER", Title: "RNR NAK: the retry waits for the RNR timer", Role: PeerRequester,
		Rule: "IBA 9.7.5.2.8 (RNR NAK), 9.7.6 (RNR timer)", Expect: "the SEND is resent no earlier than the timer the RNR NAK carries (code 22: 20.48 ms), then completes",
		Tools: rnrTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			r, o, ok := c.firstRequest(ctx)
			if !ok {
				return o
			}
			const code = 22
			_ = c.SendRNR(r.PSN(), code, "RNR NAK, timer 20.48 ms")
			at := c.Since()
			again, ok := c.awaitRequest(ctx, rnrDelay(code), samePSN(r.PSN()))
			if !ok {
				return Failf("psn=%#x not resent within %v of the RNR NAK", r.PSN(), c.patience()+rnrDelay(code))
			}
			c.Serve(again)
			d := again.At - at
			if d < rnrDelay(code)-time.Millisecond {
				return Failf("psn=%#x resent %v after the RNR NAK, before its timer of %v", r.PSN(), d.Round(100*time.Microsecond), rnrDelay(code))
			}
			return Passf("psn=%#x resent %v after the RNR NAK (timer %v)", r.PSN(), d.Round(100*time.Microsecond), rnrDelay(code))
		}})
	add(&Scenario{ID: "Q-RNR-INFINITE", Title: "rnr_retry 7 retries without limit", Role: PeerRequester,
		Rule: "IBA 9.7.6, 11.2.4.2 (rnr_retry 7 = infinite)", Expect: "the SEND is resent after each of 9 RNR NAKs (more than any finite rnr_retry), then completes",
		Tools: rnrTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			if c.Cfg.PeerRNRRetry != 7 {
				return Skipf("the peer's rnr_retry is %d, not 7 (infinite)", c.Cfg.PeerRNRRetry)
			}
			r, o, ok := c.firstRequest(ctx)
			if !ok {
				return o
			}
			const naks = 9
			s := c.watchPSN(ctx, r.PSN(), r, c.patience(), naks+1, func(x *Rx, n int) bool {
				if n <= naks {
					_ = c.SendRNR(x.PSN(), 14, fmt.Sprintf("RNR NAK %d, timer 1.28 ms", n))
				}
				return true
			})
			if s.n() < naks+1 {
				c.MarkBroken()
				return Failf("the peer gave up after %d RNR NAKs although rnr_retry is 7 (infinite)", s.n()-1)
			}
			c.Serve(s.pkt[naks])
			return Passf("psn=%#x resent after each of %d RNR NAKs; answered (rnr_retry 7: %s)", r.PSN(), naks, c.qpParams())
		}})
	add(&Scenario{ID: "Q-RNR-EXCEEDED", Title: "rnr_retry exceeded: the QP fails", Role: PeerRequester,
		Rule: "IBA 9.7.6 (RNR retry count exceeded)", Expect: "exactly rnr_retry retries after RNR NAKs, then none",
		Tools: rnrTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			if c.Cfg.PeerRNRRetry >= 7 {
				return Skipf("rnr_retry 7 is infinite (perftest, ibv_rc_pingpong and rxed use 7): the limit cannot be exceeded; a peer started with a finite rnr_retry needs --peer-rnr-retry")
			}
			r, o, ok := c.firstRequest(ctx)
			if !ok {
				return o
			}
			// Each retransmission is awaited for patience (awaitRequest):
			// one that comes late must not end the count short of
			// rnr_retry.
			s := c.watchPSN(ctx, r.PSN(), r, c.patience(), c.Cfg.PeerRNRRetry+4, func(x *Rx, n int) bool {
				_ = c.SendRNR(x.PSN(), 14, fmt.Sprintf("RNR NAK %d", n))
				return true
			})
			c.MarkBroken()
			return retryJudge(c, s.n()-1, c.Cfg.PeerRNRRetry, "RNR NAK for every transmission", s.n() == c.Cfg.PeerRNRRetry+4)
		}})
	add(&Scenario{ID: "Q-RNR-NOT-EXCEEDED", Title: "RNR NAKs within rnr_retry: the SEND completes", Role: PeerRequester,
		Rule: "IBA 9.7.6 (RNR retry count not exceeded)", Expect: "after 3 RNR NAKs (fewer than rnr_retry) the resent SEND is answered and the run completes",
		Tools: rnrTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			k := min(3, c.Cfg.PeerRNRRetry)
			if k == 0 {
				return Skipf("the peer's rnr_retry is 0")
			}
			r, o, ok := c.firstRequest(ctx)
			if !ok {
				return o
			}
			s := c.watchPSN(ctx, r.PSN(), r, c.patience(), k+1, func(x *Rx, n int) bool {
				if n <= k {
					_ = c.SendRNR(x.PSN(), 14, fmt.Sprintf("RNR NAK %d of %d", n, k))
				}
				return true
			})
			if s.n() < k+1 {
				c.MarkBroken()
				return Failf("the peer gave up after %d RNR NAKs (rnr_retry %d)", s.n()-1, c.Cfg.PeerRNRRetry)
			}
			c.Serve(s.pkt[k])
			if err := c.ServeToEnd(ctx); err != nil {
				return Failf("after %d RNR NAKs the run did not complete: %v", k, err)
			}
			return Passf("psn=%#x resent after %d RNR NAKs, then answered: the run completed", r.PSN(), k)
		}})

	add(&Scenario{ID: "Q-SEQ-GOBACK", Title: "NAK sequence error: go-back-N from the NAKed PSN", Role: PeerRequester,
		Rule: "IBA 9.7.5.2.2, 9.7.6 (PSN sequence error NAK)", Expect: "the requester resends from exactly the PSN the NAK names, at once (not after its timer); the packets before it count as acknowledged",
		Tools: ackTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			r, o, ok := c.firstRequest(ctx)
			if !ok {
				return o
			}
			max := r.PSN()
			q, qAt := r.PSN(), r.At
			if x, ok := c.Next(ctx, c.ackTimeout()/4, func(x *Rx) bool { return c.IsRequest(x) && x.PSN() == psnAdd(r.PSN(), 1) }); ok {
				c.Absorb(r)
				q, qAt, max = x.PSN(), x.At, x.PSN()
			}
			_ = c.SendNAK(q, wire.NAKPSNSeqErr, "NAK sequence error: expected this PSN")
			at := c.Since()
			for {
				x, ok := c.awaitRequest(ctx, 0, nil)
				if !ok {
					return Failf("no retransmission within %v of NAK sequence error psn=%#x", c.patience(), q)
				}
				if psnBefore(max, x.PSN()) {
					max = x.PSN() // still the first transmission
					continue
				}
				c.Serve(x)
				d := x.At - at
				// The peer's timer runs from its transmission of q, up to
				// T/4 before the NAK (the wait for a second packet above):
				// a requester that ignores the NAK resends on its timer
				// 3/4 T after the NAK, so the resend is judged from q's
				// transmission. One T after it may be its timer's.
				switch {
				case x.PSN() != q:
					return Failf("after NAK sequence error psn=%#x the peer resent from psn=%#x (%s)", q, x.PSN(), x)
				case x.At-qAt >= c.ackTimeout()-time.Millisecond:
					return Failf("resent from psn=%#x only %v after the NAK, %v after its transmission: its timer, not the NAK, drove it (T=%v)",
						q, d.Round(100*time.Microsecond), (x.At - qAt).Round(100*time.Microsecond), c.ackTimeout())
				}
				return Passf("NAK sequence error psn=%#x: resent from it %v later (%s)", q, d.Round(100*time.Microsecond), x)
			}
		}})
	seqLimit := func(id, title, rule, expect string, exceed bool) {
		add(&Scenario{ID: id, Title: title, Role: PeerRequester, Rule: rule, Expect: expect, Tools: ackTools,
			Run: func(ctx context.Context, c *Conn) Outcome {
				r, o, ok := c.firstRequest(ctx)
				if !ok {
					return o
				}
				k := min(3, c.Cfg.PeerRetry)
				limit := k + 1
				if exceed {
					limit = c.Cfg.PeerRetry + 4
				}
				nak := func(x *Rx, n int) bool {
					if exceed || n <= k {
						_ = c.SendNAK(x.PSN(), wire.NAKPSNSeqErr, fmt.Sprintf("NAK sequence error %d at the same PSN", n))
					}
					return true
				}
				// patience up to the limit, the quiet window past it
				s := c.watchPSN(ctx, r.PSN(), r, c.patience(), min(limit, c.Cfg.PeerRetry+1), nak)
				if exceed && s.n() == c.Cfg.PeerRetry+1 {
					extra := c.watchPSN(ctx, r.PSN(), nil, c.quietFor(), limit-s.n(), func(x *Rx, n int) bool { return nak(x, s.n()+n) })
					s.at, s.pkt = append(s.at, extra.at...), append(s.pkt, extra.pkt...)
				}
				if exceed {
					c.MarkBroken()
					return retryJudge(c, s.n()-1, c.Cfg.PeerRetry, fmt.Sprintf("NAK sequence error psn=%#x for every transmission", r.PSN()), s.n() == limit)
				}
				if s.n() < k+1 {
					c.MarkBroken()
					return Failf("the peer gave up after %d sequence NAKs (retry_cnt %d)", s.n()-1, c.Cfg.PeerRetry)
				}
				c.Serve(s.pkt[k])
				if err := c.ServeToEnd(ctx); err != nil {
					return Failf("after %d sequence NAKs the run did not complete: %v", k, err)
				}
				return Passf("psn=%#x resent after each of %d sequence NAKs, then answered: the run completed", r.PSN(), k)
			}})
	}
	seqLimit("Q-SEQ-LIMIT-EXCEEDED", "NAK sequence error at the same PSN: retry_cnt exceeded", "IBA 9.7.6 (sequence NAK retries count against retry_cnt)",
		"after retry_cnt resends of the same PSN, all NAKed, the requester stops (Retry Exceeded)", true)
	seqLimit("Q-SEQ-LIMIT-OK", "NAK sequence errors within retry_cnt: the request completes", "IBA 9.7.6 (retry_cnt not exceeded)",
		"after 3 sequence NAKs the resent request is answered and the run completes", false)

	implied := func(id, title, expect string, exceed bool) {
		add(&Scenario{ID: id, Title: title, Role: PeerRequester, Rule: "IBA 9.7.6.1 (implied NAK retries count against retry_cnt)", Expect: expect, Tools: readTools,
			Run: func(ctx context.Context, c *Conn) Outcome {
				r1, o, ok := c.firstRequest(ctx)
				if !ok {
					return o
				}
				p2 := psnAdd(r1.PSN(), c.reqPackets(r1))
				r2, ok := c.Next(ctx, c.ackTimeout()/3, func(x *Rx) bool { return c.IsRequest(x) && x.PSN() == p2 })
				if !ok {
					return Skipf("the peer had one READ outstanding: no later response to imply a NAK with")
				}
				c.Absorb(r1)
				c.Absorb(r2)
				answer2 := func() {
					c.ReadResponse(p2, r2.Pkt.RETH.VA(), int(r2.Pkt.RETH.DMALen()), 0, -1, "response to the second READ only")
				}
				answer2()
				k := min(3, c.Cfg.PeerRetry)
				limit := k
				if exceed {
					limit = c.Cfg.PeerRetry + 3
				}
				retries := 0
				for retries < limit && ctx.Err() == nil {
					// patience up to the limit (a late retry is not a peer that
					// gave up), the quiet window past it
					wait := c.quietFor()
					if retries < c.Cfg.PeerRetry {
						wait = c.patience()
					}
					x, ok := c.Next(ctx, wait, func(x *Rx) bool { return c.IsRequest(x) && (x.PSN() == r1.PSN() || x.PSN() == p2) })
					if !ok {
						break
					}
					if x.PSN() == r1.PSN() {
						retries++
						continue
					}
					if retries < limit || exceed {
						answer2()
					}
				}
				if exceed {
					c.MarkBroken()
					return retryJudge(c, retries, c.Cfg.PeerRetry, "only the later READ answered, every time", retries == limit)
				}
				if retries < k {
					c.MarkBroken()
					return Failf("the peer stopped re-requesting READ psn=%#x after %d implied NAKs (retry_cnt %d)", r1.PSN(), retries, c.Cfg.PeerRetry)
				}
				// Answer the earlier READ now (its retry is a duplicate).
				if err := c.ServeToEnd(ctx); err != nil {
					return Failf("after %d implied NAKs the run did not complete: %v", k, err)
				}
				return Passf("READ psn=%#x re-requested after each of %d implied NAKs, then answered: the run completed", r1.PSN(), k)
			}})
	}
	implied("Q-IMPLIED-LIMIT-EXCEEDED", "implied NAKs at the same READ: retry_cnt exceeded", "after retry_cnt re-requests of the skipped READ the requester stops (Retry Exceeded)", true)
	implied("Q-IMPLIED-LIMIT-OK", "implied NAKs within retry_cnt: the READ completes", "after 3 implied NAKs the skipped READ is answered and the run completes", false)

	add(&Scenario{ID: "Q-READ-PARTIAL", Title: "a partial READ response: re-requested from the missing PSN", Role: PeerRequester,
		Rule: "IBA 9.7.6.1.3 / 9.4.3 (READ retried from the first missing response)", Expect: "a READ request with the first missing PSN, its address and the remaining length",
		Tools: readTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			r, o, ok := c.firstRequest(ctx)
			if !ok {
				return o
			}
			n := c.reqPackets(r)
			if n < 2 {
				return Skipf("the peer's READs fit one packet (-s %d <= PMTU %d): no partial response", r.Pkt.RETH.DMALen(), c.MTU)
			}
			c.Absorb(r)
			k := n / 2
			va, l := r.Pkt.RETH.VA(), int(r.Pkt.RETH.DMALen())
			c.ReadResponse(r.PSN(), va, l, 0, k, "partial READ response")
			want := psnAdd(r.PSN(), k)
			x, ok := c.awaitRequest(ctx, 0, func(x *Rx) bool {
				return x.Pkt.Opcode == wire.RCReadRequest && !psnBefore(x.PSN(), r.PSN()) && psnBefore(x.PSN(), psnAdd(r.PSN(), n))
			})
			if !ok {
				return Failf("READ psn=%#x answered %d of %d packets: not re-requested within %v", r.PSN(), k, n, c.patience())
			}
			c.Serve(x)
			wva, wl := va+uint64(k*c.MTU), l-k*c.MTU
			switch {
			case x.PSN() == want && x.Pkt.RETH.VA() == wva && int(x.Pkt.RETH.DMALen()) == wl:
				return Passf("%d of %d responses sent; re-requested %s (va=%#x len=%d)", k, n, x, wva, wl)
			case x.PSN() == r.PSN() && x.Pkt.RETH.VA() == va && int(x.Pkt.RETH.DMALen()) == l:
				return Deviationf("%d of %d responses sent; the whole READ was requested again (%s), not from psn=%#x", k, n, x, want)
			}
			return Failf("%d of %d responses sent; re-request %s va=%#x len=%d, want psn=%#x va=%#x len=%d", k, n, x, x.Pkt.RETH.VA(), x.Pkt.RETH.DMALen(), want, wva, wl)
		}})
	add(&Scenario{ID: "Q-WRITE-PARTIAL", Title: "a multi-packet message ACKed half way: resent from the first unacknowledged PSN", Role: PeerRequester,
		Rule: "IBA 9.7.6.1.3 (retry from the oldest unacknowledged PSN)", Expect: "after the timeout the requester resends from the packet after the ACKed one, as MIDDLE/LAST (no FIRST)",
		Tools: ackTools,
		Run: func(ctx context.Context, c *Conn) Outcome {
			r, o, ok := c.firstRequest(ctx)
			if !ok {
				return o
			}
			if r.Pkt.Info.Flags&wire.FlagFirst == 0 {
				return Skipf("the peer's messages fit one packet (%s): nothing to ACK half way", r.Pkt.Opcode)
			}
			c.Absorb(r)
			_ = c.SendACK(r.PSN(), "ACK of the FIRST packet only")
			max, want := r.PSN(), psnAdd(r.PSN(), 1)
			for {
				x, ok := c.awaitRequest(ctx, 0, nil)
				if !ok {
					return Failf("nothing resent within %v after ACKing psn=%#x of a multi-packet message", c.patience(), r.PSN())
				}
				if psnBefore(max, x.PSN()) {
					max = x.PSN()
					continue
				}
				c.Serve(x)
				f := x.Pkt.Info.Flags
				switch {
				case x.PSN() == want && f&(wire.FlagMiddle|wire.FlagLast) != 0:
					return Passf("FIRST psn=%#x ACKed; resent from %s", r.PSN(), x)
				case x.PSN() == r.PSN():
					return Deviationf("FIRST psn=%#x ACKed, yet the whole message was resent (%s)", r.PSN(), x)
				}
				return Failf("FIRST psn=%#x ACKed; the retransmission started with %s, want psn=%#x MIDDLE or LAST", r.PSN(), x, want)
			}
		}})
}
