package qp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReplayBoundIsPerReadAndNotResetByAlternatingPSNs: the replay bound
// (maxReplaysWithoutProgress READ lengths) is kept per READ (per
// responder resource) and starts anew only on a retry from a later PSN
// than the latest counted or on a new request in sequence. A forger of
// the peer's address alternating duplicates between two PSNs of the READ
// (or going back to an earlier one) gets one fresh start, the first move
// forward, and no more. Going forward PSN by PSN through the READ does
// start it anew at every step, as a lossy requester's retries must: that
// bounds a forger at the READ's packet count times the bound, replies
// that go to the QP's connected peer only (hostile-peer review: the
// residual risk docs/security.md names).
func TestReplayBoundIsPerReadAndNotResetByAlternatingPSNs(t *testing.T) {
	const size, pkts = 8 * 1024, 8
	l := newLinkMTU(t, MTU1024)
	psn := PSN(0xFFFF00)
	va, rkey := l.b.m.IOVA(), l.b.m.RKey()
	l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn, va, rkey, size))
	calls, _ := l.pace(l.b, paceBudget)
	require.Len(t, flatten(calls), pkts)

	dup := func(k int) int {
		l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn.Add(uint32(k)), va+uint64(k)*1024, rkey, size-uint32(k)*1024))
		calls, _ := l.pace(l.b, paceBudget)
		return len(flatten(calls))
	}
	// 1000 duplicates alternating between the READ's first two PSNs, then
	// back and forth over its first four.
	sent := 0
	for i := range 1000 {
		sent += dup(i % 2)
	}
	for i := range 1000 {
		sent += dup([]int{0, 3, 1, 2}[i%4])
	}
	// One start at PSN 0 (1 + 64 READ lengths at most), one at PSN 1 and
	// one at PSN 3, the only moves forward: each at most 64 READ lengths.
	bound := (1 + 3*maxReplaysWithoutProgress) * pkts
	require.LessOrEqual(t, sent, bound, "alternating PSNs reset the replay bound")
	require.Positive(t, l.b.q.ctr.ReplaysLimited.Load())
	t.Logf("2000 alternating duplicates: %d response packets replayed (bound %d), %d limited", sent, bound, l.b.q.ctr.ReplaysLimited.Load())

	// Forward through the READ, PSN by PSN, on a fresh QP: each step a new
	// start. 64 READ lengths per PSN of the READ, no more.
	l = newLinkMTU(t, MTU1024)
	va, rkey = l.b.m.IOVA(), l.b.m.RKey()
	l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn, va, rkey, size))
	l.pace(l.b, paceBudget)
	sent = 0
	for k := range pkts {
		for range 2 * maxReplaysWithoutProgress * pkts {
			sent += dup(k)
		}
	}
	require.LessOrEqual(t, sent, pkts*maxReplaysWithoutProgress*pkts)
	require.Equal(t, RTS, l.b.q.State())
	t.Logf("a forward sweep: %d response packets replayed for %d duplicates (%d READ lengths)", sent, pkts*2*maxReplaysWithoutProgress*pkts, sent/pkts)
}
