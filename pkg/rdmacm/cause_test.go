package rdmacm_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestWaitsSayWhyTheirContextEnded: Dial, Request.Accept's wait,
// Listener.Accept and DialUD ended by a context cancelled with a cause
// return an error that is context.Canceled and the cause (errors.Is
// finds both). Bug (found by the RPC adopter's test,
// TestRPCServerManyClients): they returned ctx.Err() alone, so a server
// cancelling handshakes for several reasons (shutdown, a client's quota,
// its own deadline) could not tell them apart afterwards.
func TestWaitsSayWhyTheirContextEnded(t *testing.T) {
	hs := memHosts(t, nil, "10.52.0.1", "10.52.0.2")
	srv, cli := hs[0], hs[1]
	why := errors.New("shutting down")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(why)
	requireCause := func(what string, err error) {
		t.Helper()
		require.ErrorIs(t, err, context.Canceled, what)
		require.ErrorIs(t, err, why, what)
	}

	// Nobody at 10.52.0.9: the REQ goes unanswered, the wait ends by ctx.
	_, err := rdmacm.Dial(ctx, cli.qp(ib.RC), ap("10.52.0.9:7471"), nil)
	requireCause("Dial", err)
	_, err = rdmacm.DialUD(ctx, cli.dev, ap("10.52.0.9:7471"), nil)
	requireCause("DialUD", err)

	l, err := rdmacm.Listen(srv.dev, ap("10.52.0.1:7471"), nil)
	require.NoError(t, err)
	defer l.Close()
	_, err = l.Accept(ctx)
	requireCause("Listener.Accept", err)

	// A request accepted with an ended ctx is refused without a REP (one
	// could be answered by an RTU before the wait looked at ctx: a race
	// CI lost at 3f6af30, where Accept connected and returned nil).
	live := testCtx(t)
	dialed := make(chan error, 1)
	go func() {
		_, err := rdmacm.Dial(live, cli.qp(ib.RC), ap("10.52.0.1:7471"), nil)
		dialed <- err
	}()
	req, err := l.Accept(live)
	require.NoError(t, err)
	_, err = req.Accept(ctx, srv.qp(ib.RC), nil)
	requireCause("Request.Accept", err)
	var rej *rdmacm.RejectError
	require.ErrorAs(t, <-dialed, &rej, "the dialer is refused")
	require.Equal(t, mad.REJConsumerDefined, rej.Reason)
}

// TestConnParamTimeoutIsErrTimeout: Dial and DialUD whose
// ConnParam.Timeout elapses without an answer fail with ErrTimeout, the
// package's error for a peer that does not answer (and with
// context.DeadlineExceeded). Bug (found by the RPC adopter's test): they
// failed with a bare context.DeadlineExceeded, as if the caller's own
// ctx had expired, matching none of the package's errors.
func TestConnParamTimeoutIsErrTimeout(t *testing.T) {
	hs := memHosts(t, nil, "10.52.1.1")
	cli := hs[0]
	ctx := testCtx(t)
	p := &rdmacm.ConnParam{Timeout: 20 * time.Millisecond}
	// Nobody at 10.52.1.9: the REQ and the SIDR_REQ go unanswered.
	_, err := rdmacm.Dial(ctx, cli.qp(ib.RC), ap("10.52.1.9:7471"), p)
	require.ErrorIs(t, err, rdmacm.ErrTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = rdmacm.DialUD(ctx, cli.dev, ap("10.52.1.9:7471"), p)
	require.ErrorIs(t, err, rdmacm.ErrTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, ctx.Err(), "the caller's ctx did not end")
}
