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

	const dups = 54
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
