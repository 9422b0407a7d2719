package conform

import (
	"context"
	"fmt"
	"time"

	"github.com/rxed/rxed/pkg/wire"
)

// expectACK waits for the response to psn and requires an ACK with MSN
// msn (msn < 0: any MSN).
func expectACK(ctx context.Context, c *Conn, psn uint32, msn int, what string) Outcome {
	r, ok := c.Response(ctx, answerWait)
	for ok && r.Syn().Kind() == wire.SynACK && psnBefore(r.PSN(), psn) {
		// An earlier, coalescible ACK: allowed; wait for the one for psn.
		r, ok = c.Response(ctx, answerWait)
	}
	switch {
	case !ok:
		return Failf("%s: no ACK for psn=%#x within %v", what, psn, answerWait)
	case r.Pkt.Opcode != wire.RCAck || r.Syn().Kind() != wire.SynACK:
		return Failf("%s: want ACK psn=%#x, got %s", what, psn, r)
	case r.PSN() != psn:
		return Failf("%s: ACK for psn=%#x, want psn=%#x (%s)", what, r.PSN(), psn, r)
	case msn >= 0 && r.MSN() != uint32(msn):
		return Failf("%s: ACK psn=%#x carries MSN %d, want %d", what, psn, r.MSN(), msn)
	}
	return Passf("%s: %s", what, r)
}

// expectNAK requires the next response to be a NAK with code for psn,
// carrying MSN msn (msn < 0: any MSN). A NAK's MSN counts the messages
// the responder completed before it, never the request it refuses (IBA
// 9.7.5.2; rdma_rxe's send_ack puts qp->resp.msn, which only a completed
// request advances, in every NAK and RNR NAK).
func expectNAK(ctx context.Context, c *Conn, psn uint32, code uint8, msn int, what string) Outcome {
	r, ok := c.Response(ctx, answerWait)
	want := "NAK(" + wire.NAKCodeName(code) + ")"
	switch {
	case !ok:
		return Failf("%s: no response within %v, want %s psn=%#x", what, answerWait, want, psn)
	case r.Syn().Kind() != wire.SynNAK || r.Syn().NAKCode() != code:
		return Failf("%s: want %s psn=%#x, got %s", what, want, psn, r)
	case r.PSN() != psn:
		return Failf("%s: %s names psn=%#x, want %#x", what, want, r.PSN(), psn)
	case msn >= 0 && r.MSN() != uint32(msn):
		return Failf("%s: %s carries MSN %d, want %d (the messages completed before it)", what, r, r.MSN(), msn)
	}
	return Passf("%s: %s", what, r)
}

// msnWrong says why r's MSN is not want ("" when it is, or when r has no
// AETH: a READ RESPONSE MIDDLE carries none). The responder's MSN counts
// the messages it completed (IBA 9.7.5.1.1; C9-148: a READ counts when it
// is accepted, so its own responses carry it, as rdma_rxe's do: frame 30
// of shared/pcaps/perftest_read_bw_rc_4096.pcap, READ RESPONSE FIRST of
// the first READ, MSN 1); a duplicate request leaves it unchanged.
func msnWrong(r *Rx, want uint32) string {
	if r == nil || r.Pkt.AETH == nil || r.MSN() == want {
		return ""
	}
	return fmt.Sprintf("%s carries MSN %d, want %d", r, r.MSN(), want)
}

// dupACKPSNOK reports whether an ACK at psn answers a duplicate request
// at dup when the latest request executed is at latest: it acknowledges
// the duplicate (psn not before dup) and nothing the responder has not
// received (psn not after latest). rdma_rxe ACKs the latest (rxe_resp.c
// duplicate_request: send_ack at qp->resp.psn - 1, C9-105); a responder
// that ACKs the duplicate's own PSN is right too.
func dupACKPSNOK(psn, dup, latest uint32) bool {
	return !psnBefore(psn, dup) && !psnBefore(latest, psn)
}

// dupACKRule says what dupACKPSNOK wants, for evidence.
func dupACKRule(dup, latest uint32) string {
	if dup == latest {
		return fmt.Sprintf("want psn=%#x (the duplicate's, the latest received)", dup)
	}
	return fmt.Sprintf("want psn=%#x..%#x (the duplicate's up to the latest received; a later one acknowledges a request never received)", dup, latest)
}

// msnsWrong is msnWrong of the first of rs whose MSN is not want.
func msnsWrong(rs []*Rx, want uint32) string {
	for _, r := range rs {
		if why := msnWrong(r, want); why != "" {
			return why
		}
	}
	return ""
}

// responses gathers the peer's responses to our QP until want have come,
// each within answerWait of the one before, then listens extra longer for
// any further one (a second NAK, a response too many). How many arrived in
// a fixed window says nothing about a slow peer (an emulated guest, a
// loaded host): its answers come late, not wrong.
func (c *Conn) responses(ctx context.Context, want int, extra time.Duration) []*Rx {
	var got []*Rx
	for len(got) < want {
		r, ok := c.Response(ctx, answerWait)
		if !ok {
			return got
		}
		got = append(got, r)
	}
	if extra > 0 {
		got = append(got, c.Collect(ctx, extra, c.IsResponse)...)
	}
	return got
}

// expectSilence requires no response (and no echo) for d.
func expectSilence(ctx context.Context, c *Conn, d time.Duration) (string, bool) {
	got := c.Collect(ctx, d, func(r *Rx) bool {
		return r.Err == nil && r.Pkt.BTH.DestQP() == c.OurQPN
	})
	if len(got) > 0 {
		return fmt.Sprintf("the peer answered %s", got[0]), false
	}
	return fmt.Sprintf("no answer in %v", d), true
}

// dropped is the shape of every "silently dropped, keeps serving" case:
// send the bad packet, hear nothing, then the valid probe is answered.
func dropped(ctx context.Context, c *Conn, bad []byte, note string) Outcome {
	if err := c.SendRaw(bad, note); err != nil {
		return Errorf("send: %v", err)
	}
	if ev, ok := expectSilence(ctx, c, silenceWait); !ok {
		return Failf("%s: %s", note, ev)
	}
	// The probe is the connection's first message: a dropped packet
	// completes none.
	ev, ok := c.ProbeAnswered(ctx, 1)
	if !ok {
		return Failf("%s was dropped, but the peer stopped serving: %s", note, ev)
	}
	return Passf("%s: silently dropped; then %s", note, ev)
}

// combine joins step outcomes: the first non-PASS decides.
func combine(outs ...Outcome) Outcome {
	ev := ""
	for _, o := range outs {
		if o.Verdict != Pass {
			return o
		}
		if ev != "" {
			ev += "; "
		}
		ev += o.Evidence
	}
	return Passf("%s", ev)
}
