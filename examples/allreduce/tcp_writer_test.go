package allreduce

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A TCP link whose waitSent gave up on a blocked writer (its context
// ended) and that is used again anyway still closes: every writer has a
// result channel of its own, so the abandoned writer's unread result
// blocks no later writer, and close's wait for the writers returns. Bug
// (goroutine review): the writers shared one result channel with room
// for one; the abandoned writer's result filled it, the next writer
// blocked on reporting its own, and close, which joins the writers, hung.
func TestTCPLinkClosesAfterAWriteItGaveUpOn(t *testing.T) {
	exits := make(chan struct{}, 2)
	h := func(p hookPoint) {
		if p == writerExits {
			exits <- struct{}{}
		}
	}
	testHook.Store(&h)
	t.Cleanup(func() { testHook.Store(nil) })
	next, _ := net.Pipe() // nobody reads the other end: a write blocks
	prev, _ := net.Pipe()
	l := newTCPLink(Config{Rank: 0, Ranks: 2, Count: 2, Timeout: time.Minute})
	l.next, l.prev = next, prev
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, l.send(ctx, 0, make([]byte, 4), true))
	cancel()
	require.ErrorIs(t, l.waitSent(ctx), context.Canceled)
	require.NoError(t, next.Close()) // the blocked write fails; nobody takes its result
	<-exits
	require.NoError(t, l.send(context.Background(), 1, make([]byte, 4), true))
	closed := make(chan struct{})
	go func() {
		_ = l.close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("close hangs: a writer is blocked reporting its result")
	}
}
