package qp

import (
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// seqNAKs counts the PSN sequence NAKs among pkts.
func seqNAKs(t *testing.T, pkts [][]byte) int {
	t.Helper()
	n := 0
	for _, raw := range pkts {
		var p wire.Packet
		require.NoError(t, p.Parse(raw))
		if p.Opcode == wire.RCAck && p.AETH.Syndrome().Kind() == wire.SynNAK && p.AETH.Syndrome().NAKCode() == wire.NAKPSNSeqErr {
			n++
		}
	}
	return n
}

// TestNAKRateLimit: requests with a PSN ahead of the expected one
// (what anyone who can reach the port can forge) interleaved with the
// peer's in-order traffic used to draw one sequence NAK each, and every
// NAK sends the peer back over its window. Now a burst of nakBurst is
// answered, then one per nakCost in-order requests; each one not sent is
// counted. After a quiet spell a real gap is NAKed at once again.
//
// Regression test: was TestRegressNAKRateLimit in regress_nakrate_test.go
// (added in commit 89ddd40).
func TestNAKRateLimit(t *testing.T) {
	l := newLinkMTU(t, MTU1024)
	psn := PSN(0xFFFF00)
	va, rkey := l.b.m.IOVA(), l.b.m.RKey()
	const rounds = 100
	naks := 0
	for i := range rounds {
		l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn.Add(1000), va, rkey, 1024)) // forged, ahead
		naks += seqNAKs(t, l.b.env.take())
		l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn, va, rkey, 1024)) // the peer's, in order
		calls, _ := l.pace(l.b, paceBudget)
		require.Len(t, flatten(calls), 1, "round %d: the in-order READ is answered", i)
		psn = psn.Next()
	}
	ctr := l.b.q.ctr
	require.Equal(t, uint64(rounds), ctr.OutOfSeqRequest.Load())
	// Before the limit: one NAK per forged request (100).
	t.Logf("%d sequence NAKs for %d forged requests", naks, rounds)
	require.LessOrEqual(t, naks, nakBurst+rounds/nakCost, "NAKs sent for %d forged requests", rounds)
	require.GreaterOrEqual(t, naks, rounds/nakCost, "the limit starves the NAKs")
	require.Equal(t, uint64(rounds-naks), ctr.NAKsLimited.Load())

	// Quiet: in-order traffic pays the debt off; a real gap is NAKed.
	for range nakCost * nakBurst {
		l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn, va, rkey, 1024))
		l.pace(l.b, paceBudget)
		psn = psn.Next()
	}
	l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn.Add(1), va, rkey, 1024))
	require.Equal(t, 1, seqNAKs(t, l.b.env.take()), "a gap after quiet traffic is NAKed")
	require.Equal(t, RTS, l.b.q.State())
}
