package rdmacm_test

import (
	"context"
	"errors"
	"runtime"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestAcceptAfterThePeerGaveUp: a client whose Dial's ctx ends while the
// server holds its request destroys its CM ID with a REJ (timeout, as
// cm_destroy_id in REQ_SENT). The server's Accept of that request then
// fails with the peer's refusal, a *RejectError as Dial reports one, and
// leaves its QP in ERR. Bug (found by the RPC adopter's test,
// TestRPCServerManyClients): Accept returned the CM's internal
// "cm: invalid state" (cm.ErrState), matching none of the package's
// documented errors.
func TestAcceptAfterThePeerGaveUp(t *testing.T) {
	hs := memHosts(t, nil, "10.51.0.1", "10.51.0.2")
	srv, cli := hs[0], hs[1]
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.51.0.1:7471"), nil)
	require.NoError(t, err)
	defer l.Close()

	dctx, giveUp := context.WithCancel(ctx)
	dialed := make(chan error, 1)
	cq := cli.qp(ib.RC)
	go func() {
		_, err := rdmacm.Dial(dctx, cq, ap("10.51.0.1:7471"), nil)
		dialed <- err
	}()
	req, err := l.Accept(ctx) // the client waits in REQ_SENT
	require.NoError(t, err)
	giveUp()
	require.ErrorIs(t, <-dialed, context.Canceled)
	require.Equal(t, ib.QPSReset, cq.State(), "a Dial that ends before the REP leaves its QP as given")
	for rdmacm.Counters(srv.dev)["rx_rej"] == 0 { // the client's REJ reached the server's CM
		runtime.Gosched()
	}

	q := srv.qp(ib.RC)
	_, err = req.Accept(ctx, q, nil)
	var rej *rdmacm.RejectError
	require.ErrorAs(t, err, &rej, "%v", err)
	require.Equal(t, mad.REJTimeout, rej.Reason, "the REJ of a destroyed REQ_SENT ID")
	require.Equal(t, ib.QPSErr, q.State())
	require.False(t, errors.Is(err, context.Canceled))
	require.NoError(t, q.Destroy())
}

// TestRejectAfterThePeerGaveUp: rejecting a request whose client gave up
// first (its REJ already in) succeeds: the request is refused either
// way, and a second answer is ErrAnswered. Bug (found with
// TestAcceptAfterThePeerGaveUp): Reject returned the CM's internal
// "cm: invalid state", matching none of the package's errors.
func TestRejectAfterThePeerGaveUp(t *testing.T) {
	hs := memHosts(t, nil, "10.51.1.1", "10.51.1.2")
	srv, cli := hs[0], hs[1]
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.51.1.1:7471"), nil)
	require.NoError(t, err)
	defer l.Close()

	dctx, giveUp := context.WithCancel(ctx)
	dialed := make(chan error, 1)
	go func() {
		_, err := rdmacm.Dial(dctx, cli.qp(ib.RC), ap("10.51.1.1:7471"), nil)
		dialed <- err
	}()
	req, err := l.Accept(ctx)
	require.NoError(t, err)
	giveUp()
	require.ErrorIs(t, <-dialed, context.Canceled)
	for rdmacm.Counters(srv.dev)["rx_rej"] == 0 { // the client's REJ reached the server's CM
		runtime.Gosched()
	}
	require.NoError(t, req.Reject([]byte("busy")))
	require.ErrorIs(t, req.Reject(nil), rdmacm.ErrAnswered)
	require.Zero(t, rdmacm.Counters(srv.dev)["tx_rej"], "nothing to send to a peer that gave up")
}
