package allreduce

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// A previous rank that sends a chunk for a step the ring cannot be at
// fails the ring as soon as the rank handles the chunk's completion, with
// an error that names that rank, its address and the step received
// against the step expected. Bug (workload audit): every immediate was
// stored in a set, checked only when recv awaited a step: a stray step
// (1000 here) grew the set and was never reported (the rank waited for
// step 0 until Timeout and blamed the previous rank's silence); one
// beyond the window was reported, unnamed, only when its step came due.
func TestChunkOfAStepTheRingCannotBeAtFailsAtOnce(t *testing.T) {
	const timeout = 10 * time.Second
	n := 3
	for _, c := range []struct {
		name  string
		steps []uint32 // what rank 2, rank 0's previous, sends before rank 0 starts
		want  string
	}{
		{"out of order", []uint32{1000}, "sent the chunk of step 1000 while step 0 was expected"},
		// Rank 0 posts step 0's WRITE before it polls: the previous rank
		// may then be at step ranks-1 (2), no further.
		{"past the window", []uint32{0, 1, 2, 3}, "sent the chunk of step 3 while step 2 at most was expected"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			ms, err := Join(ctx, n, rdmaDialer(t, transport.NewMemNetwork(), same(n, n), same(n, 300), timeout))
			require.NoError(t, err)
			defer closeAll(ms)
			prev := ms[2].(*RDMARank).Ring.l.(*rdmaLink)
			chunk := f32bytes(ms[2].Data()[:100])
			for _, s := range c.steps {
				require.NoError(t, prev.send(ctx, s, chunk, true))
			}
			require.NoError(t, prev.waitSent(ctx)) // in rank 0's CQ, all of them
			err = allReduceWithin(t, ms[0], timeout/2)
			require.ErrorContains(t, err, fmt.Sprintf("rank 2 (%v:", CMAddr(rdmaBase, 2, 0).Addr()))
			require.ErrorContains(t, err, c.want)
		})
	}
}

// A WRITE with immediate on the next rank's connection is not a chunk:
// the error names the next rank, which sent it. Bug (workload audit): any
// WRITE with immediate counted as the previous rank's chunk of the step
// its immediate named (here step 0, whose sum rank 0 would have made of
// its slot's stale bytes), and its receive was reposted on the previous
// rank's QP.
func TestWriteWithImmediateFromTheNextRankNamesIt(t *testing.T) {
	const timeout = 10 * time.Second
	n := 3
	ctx := context.Background()
	ms, err := Join(ctx, n, rdmaDialer(t, transport.NewMemNetwork(), same(n, n), same(n, 300), timeout))
	require.NoError(t, err)
	defer closeAll(ms)
	next := ms[1].(*RDMARank).Ring.l.(*rdmaLink)
	next.probing = true // its completion is handled as a probe's
	require.NoError(t, next.qpPrev.PostSend(ib.SendWR{ID: probeID, Opcode: ib.WRRDMAWriteWithImm, Flags: ib.SendSignaled, Imm: 0}))
	require.NoError(t, next.poll(ctx, func() bool { return !next.probing }))
	err = allReduceWithin(t, ms[0], timeout/2)
	require.ErrorContains(t, err, fmt.Sprintf("rank 1 (%v:", CMAddr(rdmaBase, 1, 0).Addr()))
	require.ErrorContains(t, err, "wrote to this rank with immediate 0: only the previous rank, 2, sends it chunks")
}

// allReduceWithin runs m's AllReduce alone and returns its error, failing
// t if it has not returned within d (well before the step Timeout).
func allReduceWithin(t *testing.T, m Member, d time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- m.AllReduce(context.Background()) }()
	select {
	case err := <-done:
		t.Log(err)
		require.Error(t, err)
		return err
	case <-time.After(d):
		t.Fatalf("AllReduce had not failed after %v", d)
		return nil
	}
}

// The TCP ring names the previous rank and its address too when it sends
// a step other than the one expected (its stream keeps the order, so any
// other step is wrong). Bug (workload audit): the error named the rank
// without its address, which the RDMA ring's now gives.
func TestTCPChunkOfAnotherStepNamesItsSender(t *testing.T) {
	const timeout = 10 * time.Second
	n := 2
	ctx := context.Background()
	ms, err := Join(ctx, n, tcpDialer(freePortBase(t, n), same(n, n), same(n, 300), timeout))
	require.NoError(t, err)
	defer closeAll(ms)
	prev := ms[1].(*Ring).l.(*tcpLink)
	require.NoError(t, prev.send(ctx, 1000, f32bytes(ms[1].Data()[:150]), true))
	require.NoError(t, prev.waitSent(ctx))
	err = allReduceWithin(t, ms[0], timeout/2)
	require.ErrorContains(t, err, fmt.Sprintf("rank 1 (%v) sent step 1000 (600 bytes) while expecting step 0 (600 bytes)",
		ms[0].(*Ring).l.(*tcpLink).prev.RemoteAddr()))
}
