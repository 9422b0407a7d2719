package ib_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

var destroyedTestCap = ib.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}

// TestCreateQPRefusesADestroyedCQOrSRQ: CreateQP given a destroyed CQ or
// SRQ fails with ErrDestroyed and holds nothing: the PD and the other CQ
// can still be released. Bug (found by an audit of the engine, session
// AE; fixed in session AF): CreateQP counted the QP as a user of the
// destroyed CQ and returned a QP whose completions went to a queue that
// refuses them.
func TestCreateQPRefusesADestroyedCQOrSRQ(t *testing.T) {
	p := openPeer(transport.NewMemNetwork(), "10.78.0.1")
	defer p.dev.Close()
	pd, err := p.dev.AllocPD()
	require.NoError(t, err)
	live, err := p.dev.CreateCQ(8)
	require.NoError(t, err)
	dead, err := p.dev.CreateCQ(8)
	require.NoError(t, err)
	require.NoError(t, dead.Destroy())
	require.NoError(t, dead.Destroy(), "destroying a CQ twice is harmless")

	for _, attr := range []ib.QPInitAttr{
		{Type: ib.RC, SendCQ: dead, RecvCQ: live, Cap: destroyedTestCap},
		{Type: ib.RC, SendCQ: live, RecvCQ: dead, Cap: destroyedTestCap},
		{Type: ib.UD, SendCQ: dead, RecvCQ: dead, Cap: destroyedTestCap},
	} {
		q, err := pd.CreateQP(attr)
		require.ErrorIs(t, err, ib.ErrDestroyed)
		require.Nil(t, q)
	}

	srq, err := pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 4, MaxSGE: 1})
	require.NoError(t, err)
	require.NoError(t, srq.Destroy())
	require.ErrorIs(t, srq.Destroy(), ib.ErrDestroyed, "an SRQ destroyed twice")
	q, err := pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: live, RecvCQ: live, SRQ: srq, Cap: destroyedTestCap})
	require.ErrorIs(t, err, ib.ErrDestroyed)
	require.Nil(t, q)

	require.NoError(t, live.Destroy(), "the refused CreateQPs left no hold on the live CQ")
	require.NoError(t, pd.Dealloc(), "nor on the PD")
}

// TestCreateQPRacingCQDestroy: of a CreateQP and a Destroy of its CQ run
// at once, exactly one succeeds: either the QP holds the CQ and Destroy
// fails with ErrBusy, or the CQ is destroyed and CreateQP fails with
// ErrDestroyed. Bug (session AF): Destroy read the use count and then
// marked the CQ destroyed, so a CreateQP between the two succeeded on a
// destroyed CQ.
func TestCreateQPRacingCQDestroy(t *testing.T) {
	p := openPeer(transport.NewMemNetwork(), "10.78.0.2")
	defer p.dev.Close()
	won := map[string]int{}
	for i := 0; i < 2000; i++ {
		cq, err := p.dev.CreateCQ(8)
		require.NoError(t, err)
		var wg sync.WaitGroup
		var q *ib.QP
		var createErr, destroyErr error
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			q, createErr = p.pd.CreateQP(ib.QPInitAttr{Type: ib.UD, SendCQ: cq, RecvCQ: cq, Cap: destroyedTestCap})
		}()
		go func() { defer wg.Done(); <-start; destroyErr = cq.Destroy() }()
		close(start)
		wg.Wait()
		switch {
		case createErr == nil && errors.Is(destroyErr, ib.ErrBusy):
			won["create"]++
			require.NoError(t, q.Destroy())
			require.NoError(t, cq.Destroy())
		case errors.Is(createErr, ib.ErrDestroyed) && destroyErr == nil:
			won["destroy"]++
		default:
			t.Fatalf("iteration %d: CreateQP err=%v, CQ.Destroy err=%v", i, createErr, destroyErr)
		}
	}
	t.Logf("first of the two: %v", won)
}
