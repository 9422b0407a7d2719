package qp

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// What a requester sends to a peer that died: rxe resends its window
// once per local ACK timeout, retry_cnt times, and gives up at the next.
// rxed's fast retransmit (recovery.go) resends earlier, but only while it
// may be a loss rather than a death: maxUnansweredFastRetransmits go-backs
// without any response, then IBA's timer alone. (Timer audit, session AH:
// a warmed-up requester kept going back every quarter timeout, the backoff
// capped there, and sent a dead peer 4,704 packets in the 2.15 s before
// it gave up; and a go-back on IBA's timeout left the fast timer armed
// for the window before it, to resend the same window again at once.)
func TestDeadPeerSentAtMostTheFastRetransmitsAndRetryCntWindows(t *testing.T) {
	for _, p := range []struct{ timeout, retry uint8 }{{14, 7}, {16, 7}, {14, 0}, {12, 3}} {
		for _, op := range []WROpcode{WRRDMAWrite, WRRDMARead, WRSend} {
			t.Run(fmt.Sprintf("timeout=%d/retry=%d/%v", p.timeout, p.retry, op), func(t *testing.T) {
				l := giveUpLink(t, p.timeout, p.retry, 7, 3)
				for i := range 16 {
					require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{l.b.sge(0, 16<<10)}}))
				}
				l.warmUp()
				for i := range 4 {
					require.NoError(t, l.a.q.PostSend(&SendWR{ID: uint64(i), Opcode: op, Flags: Signaled,
						SGL: []SGE{l.a.sge(0, 16<<10)}, RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()}))
				}
				l.a.q.Run(l.a.env, l.now, 1000)
				window := len(l.a.env.take())
				require.NotZero(t, window)
				sent, goBacks := 0, 0
				for steps := 0; ; steps++ {
					require.Less(t, steps, 100_000, "the requester never gave up")
					l.now = l.a.q.Deadline()
					require.False(t, l.now.IsZero(), "requests outstanding and no timer armed")
					l.a.q.OnTimer(l.a.env, l.now, 1000)
					if n := len(l.a.env.take()); n > 0 {
						sent += n
						goBacks++
					}
					if wcs := poll(t, l.a.scq); len(wcs) > 0 {
						require.Equal(t, WCRetryExcErr, wcs[0].Status)
						break
					}
				}
				t.Logf("window %d packets; %d resends of %d packets in all (%d fast retransmits)",
					window, goBacks, sent, l.a.q.ctr.FastRetransmits.Load())
				fast := int(l.a.q.ctr.FastRetransmits.Load())
				require.LessOrEqual(t, fast, maxUnansweredFastRetransmits, "fast retransmits without an answer")
				require.Equal(t, fast+int(p.retry), goBacks, "one resend per go-back: each fast retransmit and each retry")
				require.LessOrEqual(t, sent, (fast+int(p.retry))*window)
			})
		}
	}
}

// A go-back on a sequence-error NAK (which acknowledges nothing when the
// first packet of the window was lost) restarts the fast retransmit timer
// from the resend: the deadline armed when the window was first sent
// would go back again a round trip after the resend, before its answer
// could come. (Timer audit, session AH: "the fast-retransmit timer may be
// left stale after a go-back".)
func TestGoBackOnNAKRestartsTheFastRetransmitTimer(t *testing.T) {
	l := giveUpLink(t, 14, 7, 7, 3)
	l.warmUp()
	sentAt := l.now
	l.post(SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 8<<10)},
		RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()})
	pkts := l.a.env.take()
	require.Len(t, pkts, 8)
	require.Equal(t, sentAt.Add(l.a.q.rto()), l.a.q.rec.rtoAt)
	l.now = l.now.Add(100 * time.Microsecond)
	l.deliver(l.b, l.a, pkts[1:]...) // the first is lost
	nak := l.b.env.take()
	require.Len(t, nak, 1, "one sequence-error NAK")
	l.now = l.now.Add(100 * time.Microsecond)
	l.deliver(l.a, l.b, nak...)
	require.Len(t, l.a.env.take(), 8, "the window resent")
	require.Equal(t, l.now.Add(l.a.q.rto()), l.a.q.rec.rtoAt, "the fast timer runs from the resend")
	require.Zero(t, l.a.q.ctr.FastRetransmits.Load())
}
