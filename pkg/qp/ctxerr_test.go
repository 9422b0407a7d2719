package qp

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCQWaitSaysWhyItsContextEnded: a CQ wait ended by a context
// cancelled with a cause returns an error that is both context.Canceled
// and the cause. Bug (found by the RPC adopter's test): Wait returned
// ctx.Err() alone, so an application that cancels waits for several
// reasons (a deadline of its own, a peer gone, shutdown) could not tell
// which one ended the wait.
func TestCQWaitSaysWhyItsContextEnded(t *testing.T) {
	cq, err := NewCQ(4)
	require.NoError(t, err)
	why := errors.New("the peer went away")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(why)
	err = cq.Wait(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, why)
	_, err = cq.WaitPoll(ctx, make([]WC, 1))
	require.ErrorIs(t, err, why)

	// Without a cause it is ctx.Err() itself.
	plain, cancelPlain := context.WithCancel(context.Background())
	cancelPlain()
	require.Equal(t, context.Canceled, cq.Wait(plain))
}
