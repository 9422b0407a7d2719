package ib_test

import (
	"context"
	"errors"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

func TestCompChannel(t *testing.T) {
	net := transport.NewMemNetwork()
	p := openPeer(net, "10.6.0.1")
	defer p.close()
	ch := p.dev.CreateCompChannel()
	_, err := p.dev.CreateCQOnChannel(0, ch)
	require.ErrorIs(t, err, ib.ErrCQSize)
	_, err = p.dev.CreateCQOnChannel(4, nil)
	require.Error(t, err)
	c1, err := p.dev.CreateCQOnChannel(4, ch)
	require.NoError(t, err)
	c2, err := p.dev.CreateCQOnChannel(4, ch)
	require.NoError(t, err)

	// Unarmed CQs do not notify; armed ones once per arm, in firing order.
	require.NoError(t, ib.Push(c1, ib.WC{ID: 1}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = ch.GetCQEvent(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, c1.ReqNotify(false))
	require.NoError(t, c2.ReqNotify(false))
	require.NoError(t, ib.Push(c2, ib.WC{ID: 2}))
	require.NoError(t, ib.Push(c1, ib.WC{ID: 3}))
	require.NoError(t, ib.Push(c1, ib.WC{ID: 4}))
	for _, want := range []*ib.CQ{c2, c1} {
		got, err := ch.GetCQEvent(context.Background())
		require.NoError(t, err)
		require.Same(t, want, got)
	}
	_, err = ch.GetCQEvent(ctx)
	require.ErrorIs(t, err, context.Canceled, "the second push on c1 found it disarmed")

	// Destroy: refused while CQs exist; then wakes a blocked waiter.
	require.ErrorIs(t, ch.Destroy(), ib.ErrBusy)
	require.NoError(t, c1.Destroy())
	require.NoError(t, c1.Destroy(), "destroying twice releases the channel once")
	require.ErrorIs(t, ch.Destroy(), ib.ErrBusy)
	require.NoError(t, c2.Destroy())
	errc := make(chan error)
	go func() {
		_, err := ch.GetCQEvent(context.Background())
		errc <- err
	}()
	require.NoError(t, ch.Destroy())
	require.ErrorIs(t, <-errc, ib.ErrChannelClosed)
	_, err = p.dev.CreateCQOnChannel(4, ch)
	require.ErrorIs(t, err, ib.ErrChannelClosed)
}

// TestGetCQEventSaysWhyItsContextEnded: GetCQEvent ended by a context
// cancelled with a cause returns an error that is context.Canceled and
// the cause (found by the RPC adopter's test: it returned ctx.Err()
// alone, as CQ.WaitPoll did, see pkg/qp's TestCQWaitSaysWhyItsContextEnded).
func TestGetCQEventSaysWhyItsContextEnded(t *testing.T) {
	p := openPeer(transport.NewMemNetwork(), "10.6.0.9")
	defer p.close()
	ch := p.dev.CreateCompChannel()
	cq, err := p.dev.CreateCQ(4)
	require.NoError(t, err)
	why := errors.New("shutting down")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(why)
	_, err = ch.GetCQEvent(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, why)
	_, err = cq.WaitPoll(ctx, make([]ib.WC, 1))
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, why)
}
