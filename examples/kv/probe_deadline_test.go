package kv

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// requireClosed waits (bounded) for ch to close.
func requireClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal(what)
	}
}

func requireOpen(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatal(what)
	default:
	}
}

// probeDeadline, the context of a client's wait for a response
// (waitSome), is done when its deadline passes, whether the wait spins
// (Err, no timer) or sleeps (Done arms the client's timer), and when its
// parent ends; a parent of an earlier wait, or an earlier wait's timer,
// does not end a later wait; and a wait allocates nothing once the
// client has its timer. Bug (workload audit): each PUT's wait was a
// context.WithTimeoutCause, 4 allocations
// (TestRDMAPutAllocatesNothingInTheClient).
func TestProbeDeadline(t *testing.T) {
	t.Run("spinning: Err says when the deadline passed", func(t *testing.T) {
		var p probeDeadline
		ctx := p.begin(context.Background(), time.Hour)
		require.NoError(t, ctx.Err())
		require.False(t, p.end())
		ctx = p.begin(context.Background(), 0)
		require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
		require.True(t, p.end())
		require.Nil(t, p.timer, "no timer for a wait that never slept")
	})
	t.Run("sleeping: Done closes at the deadline", func(t *testing.T) {
		var p probeDeadline
		for range 3 { // the one timer, again
			ctx := p.begin(context.Background(), time.Millisecond)
			requireClosed(t, ctx.Done(), "the deadline's timer closes Done")
			require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
			require.True(t, p.end())
		}
	})
	t.Run("the parent's end ends a sleeping wait", func(t *testing.T) {
		var p probeDeadline
		parent, cancel := context.WithCancel(context.Background())
		ctx := p.begin(parent, time.Hour)
		done := ctx.Done()
		requireOpen(t, done, "a live wait is not done")
		cancel()
		requireClosed(t, done, "the parent's cancellation closes Done")
		require.ErrorIs(t, ctx.Err(), context.Canceled)
		require.False(t, p.end(), "not due: cancelled")
		// The next wait under the cancelled parent ends at once.
		ctx = p.begin(parent, time.Hour)
		requireClosed(t, ctx.Done(), "a wait under an ended parent is done")
		p.end()
		p.release()
	})
	t.Run("an earlier parent or timer does not end a later wait", func(t *testing.T) {
		var p probeDeadline
		old, cancelOld := context.WithCancel(context.Background())
		p.begin(old, time.Hour).Done()
		p.end()
		cur, cancelCur := context.WithCancel(context.Background())
		defer cancelCur()
		ctx := p.begin(cur, time.Hour)
		done := ctx.Done()
		require.Equal(t, cur.Done(), p.watched, "the wait watches its own parent")
		require.Nil(t, context.Cause(old), "old is live")
		cancelOld()
		p.expire() // a timer that fired as the earlier wait ended
		requireOpen(t, done, "an earlier parent or timer ended a later wait")
		require.NoError(t, ctx.Err())
		p.end()
		p.release()
	})
	t.Run("a wait allocates nothing", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		defer cancel()
		for _, under := range []context.Context{context.Background(), parent} {
			var p probeDeadline
			wait := func() {
				ctx := p.begin(under, time.Hour)
				_ = ctx.Err()
				_ = ctx.Done() // the wait sleeps
				p.end()
			}
			wait() // the client's timer, and the parent's registration
			require.Zero(t, testing.AllocsPerRun(100, wait))
			p.release()
		}
	})
}
