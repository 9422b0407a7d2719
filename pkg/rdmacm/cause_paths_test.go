package rdmacm_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// holdOnly makes tap hold back every CM message that keep reports, from
// now on (tap.hold is read under tap.mu by the device's sends).
func holdOnly(tap *madTap, keep func(mad.Message) bool) {
	tap.mu.Lock()
	tap.hold = keep
	tap.mu.Unlock()
}

// TestDisconnectSaysWhyItsContextEnded: a Disconnect whose DREQ goes
// unanswered and whose ctx was cancelled with a cause returns an error
// that is both context.Canceled and that cause, as the package's other
// waits do (doc.go). Bug reference: Disconnect's qp.ContextError landed
// with TestWaitsSayWhyTheirContextEnded, which covers Dial, DialUD and
// both Accepts but not Disconnect; ctx.Err() alone there passed every
// test.
func TestDisconnectSaysWhyItsContextEnded(t *testing.T) {
	net := transport.NewMemNetwork()
	tap := &madTap{}
	srv := openMemHost(t, net, "10.52.2.1", nil)
	cli := openMemHost(t, net, "10.52.2.2", tap)
	live := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.52.2.1:7471"), nil)
	require.NoError(t, err)
	defer l.Close()
	got := serveOne(live, srv, l, nil)
	c, err := rdmacm.Dial(live, cli.qp(ib.RC), ap("10.52.2.1:7471"), nil)
	require.NoError(t, err)
	require.NoError(t, (<-got).err)

	// Our DREQ never leaves: no DREP can end the wait, only ctx (the
	// CM's own DREQ retries take seconds).
	holdOnly(tap, func(m mad.Message) bool { _, dreq := m.(*mad.DREQ); return dreq })
	why := errors.New("operator gave up on the peer")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(why)
	err = c.Disconnect(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, why, "Disconnect lost its context's cause")
	select {
	case <-c.Done():
		t.Fatal("the connection ended without an answer to its DREQ")
	default:
	}
}

// TestAcceptConnParamTimeoutIsErrTimeout: Request.Accept whose
// ConnParam.Timeout elapses after its REP with no RTU (the dialer's
// answer lost) fails with ErrTimeout, the package's error for a peer
// that does not answer, and with context.DeadlineExceeded; the caller's
// ctx has not ended. Bug reference: the mapping (errTimeoutParam as the
// timeout's cause) landed with TestConnParamTimeoutIsErrTimeout, which
// covers Dial and DialUD only; a bare context.WithTimeout in Accept
// passed every test, its failure looking like the caller's own deadline.
func TestAcceptConnParamTimeoutIsErrTimeout(t *testing.T) {
	net := transport.NewMemNetwork()
	// The server's REP never leaves, so no RTU comes; the CM's own REP
	// retries take seconds, far beyond the Timeout below.
	tap := &madTap{hold: func(m mad.Message) bool { _, rep := m.(*mad.REP); return rep }}
	srv := openMemHost(t, net, "10.52.3.1", tap)
	cli := openMemHost(t, net, "10.52.3.2", nil)
	live := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.52.3.1:7471"), nil)
	require.NoError(t, err)
	defer l.Close()
	dctx, dcancel := context.WithCancel(live)
	defer dcancel()
	dialed := make(chan error, 1)
	go func() {
		_, err := rdmacm.Dial(dctx, cli.qp(ib.RC), ap("10.52.3.1:7471"), nil)
		dialed <- err
	}()
	req, err := l.Accept(live)
	require.NoError(t, err)

	_, err = req.Accept(live, srv.qp(ib.RC), &rdmacm.ConnParam{Timeout: 20 * time.Millisecond})
	require.ErrorIs(t, err, rdmacm.ErrTimeout, "Accept's ConnParam.Timeout is not ErrTimeout")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, live.Err(), "the caller's ctx did not end")
	require.Equal(t, 1, tap.heldCount(), "the REP was sent (held), so Accept waited after it")

	dcancel() // the dialer's REQ was never answered with a REP
	require.Error(t, <-dialed)
}
