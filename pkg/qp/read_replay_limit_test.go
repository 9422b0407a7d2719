package qp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReplayLimit: duplicates of one READ that make no progress
// (the same PSN again and again: 54 of them sent 3.4 GB to a victim in
// the run) are replayed up to maxReplaysWithoutProgress READ
// lengths, the rest dropped and counted; a retry from a later PSN (what a lossy requester
// sends) is replayed again, and the QP stays usable.
//
// Regression test: was TestRegressReplayLimit in regress_replaylimit_test.go
// (added in commit 89ddd40).
func TestReplayLimit(t *testing.T) {
	const size = 8 * 1024
	l := newLinkMTU(t, MTU1024)
	psn := PSN(0xFFFF00)
	va, rkey := l.b.m.IOVA(), l.b.m.RKey()
	l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn, va, rkey, size))
	calls, _ := l.pace(l.b, paceBudget)
	require.Len(t, flatten(calls), size/1024)

	const dups = maxReplaysWithoutProgress + 38 // the run sent 54
	sent := 0
	for range dups {
		l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn, va, rkey, size))
		calls, _ := l.pace(l.b, paceBudget)
		sent += len(flatten(calls))
	}
	require.Equal(t, maxReplaysWithoutProgress*size/1024, sent, "response packets replayed for %d identical duplicates", dups)
	require.Equal(t, uint64(dups-maxReplaysWithoutProgress), l.b.q.ctr.ReplaysLimited.Load())

	// Progress: the requester got the first 3 KiB and asks for the rest.
	l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn.Add(3), va+3072, rkey, size-3072))
	calls, _ = l.pace(l.b, paceBudget)
	readResponses(t, flatten(calls), psn.Add(3), false, 1024, l.b.buf[3072:size])
	// And an earlier PSN again counts against the bound anew.
	l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn, va, rkey, size))
	calls, _ = l.pace(l.b, paceBudget)
	require.Len(t, flatten(calls), size/1024)
	require.Equal(t, RTS, l.b.q.State())
}

// TestReplayBoundStartsAnewOnNewRequests: identical duplicates of a READ
// are bounded only while nothing new arrives; a request taken in sequence
// shows a requester that moves on, and the READ's duplicates are replayed
// again. A go-back-N requester asks again for every READ behind a gap on
// each retry of the gap: with the bound counted for good, a READ stream
// at 20% loss was refused the replays of the READs behind a stuck one and
// failed with RETRY_EXC_ERR (TestReadStreamSurvivesHeavyLoss).
func TestReplayBoundStartsAnewOnNewRequests(t *testing.T) {
	const size = 4 * 1024
	l := newLinkMTU(t, MTU1024)
	psn := PSN(0xFFFF00) // the link's first PSN
	va, rkey := l.b.m.IOVA(), l.b.m.RKey()
	l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn, va, rkey, size))
	calls, _ := l.pace(l.b, paceBudget)
	require.Len(t, flatten(calls), size/1024)

	replay := func() int {
		l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn, va, rkey, size))
		calls, _ := l.pace(l.b, paceBudget)
		return len(flatten(calls))
	}
	for i := range maxReplaysWithoutProgress {
		require.Equalf(t, size/1024, replay(), "duplicate %d is within the bound", i)
	}
	require.Zero(t, replay(), "past the bound with nothing new in between")
	require.Equal(t, uint64(1), l.b.q.ctr.ReplaysLimited.Load())

	// A new READ in sequence (the requester's window moved on).
	next := psn.Add(size / 1024)
	l.receiveOnly(l.b, l.a, readRequest(t, l.b, next, va+size, rkey, size))
	calls, _ = l.pace(l.b, paceBudget)
	readResponses(t, flatten(calls), next, true, 1024, l.b.buf[size:2*size])
	require.Equal(t, size/1024, replay(), "the first READ's duplicates count anew")
	require.Equal(t, uint64(1), l.b.q.ctr.ReplaysLimited.Load())
}

// TestReadStreamSurvivesHeavyLoss: 64 KiB READs, 16 outstanding, 20% of
// the packets lost both ways (deterministic model, three seeds): every
// READ completes. Seeds 1 and 2 failed with RETRY_EXC_ERR while the
// responder counted the replays of the READs behind a gap for good
// (maxReplaysWithoutProgress); seed 3 gets no round-trip sample at all
// and recovers by IBA's timer alone, as rxe does.
func TestReadStreamSurvivesHeavyLoss(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		_, c := simGoodput(t, WRRDMARead, MTU4096, 0.2, seed, 100, 16)
		require.Zerof(t, c.RetryExceededErr.Load(), "seed %d", seed)
	}
}
