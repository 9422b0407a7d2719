package rdmacm_test

import (
	"context"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm/cmtest"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

type dialed struct {
	conn *rdmacm.Conn
	err  error
}

// TestFullBacklogDropsTheREQUntilThereIsRoom: with Backlog 1 and the first
// request waiting for Accept, a second Dial's REQ is dropped without an
// answer, as the kernel drops it (ucma_connect_event_handler fails with
// -ENOMEM, and cm_destroy_id sends no REJ for it "to allow future
// retries"): the second Dial is not refused and waits. Once the first
// request is accepted, the client's REQ retransmission (the CM clocks are
// stopped until the test moves them past its timeout) is a new request,
// queued, accepted, and the second Dial completes.
//
// Bug (CM follow-up, full backlog): the second REQ got REJ 28 and Dial
// failed at once, where a kernel listener lets it connect on its retry.
func TestFullBacklogDropsTheREQUntilThereIsRoom(t *testing.T) {
	net := transport.NewMemNetwork()
	tap := &madTap{}
	srv, cli := openMemHost(t, net, "10.12.0.1", tap), openMemHost(t, net, "10.12.0.2", nil)
	fc := cmtest.NewFakeClock(time.Unix(4_000_000, 0))
	require.NoError(t, rdmacm.Enable(srv.dev, &rdmacm.Config{Clock: fc}))
	require.NoError(t, rdmacm.Enable(cli.dev, &rdmacm.Config{Clock: fc}))
	ctx := testCtx(t)

	l, err := rdmacm.Listen(srv.dev, ap("10.12.0.1:7472"), &rdmacm.ListenOptions{Backlog: 1})
	require.NoError(t, err)
	defer l.Close()
	dial := func() <-chan dialed {
		out := make(chan dialed, 1)
		q := cli.qp(ib.RC)
		go func() {
			c, err := rdmacm.Dial(ctx, q, l.Addr(), nil)
			out <- dialed{c, err}
		}()
		return out
	}
	counter := func(dev *ib.Device, name string) func() bool {
		return func() bool { return rdmacm.Counters(dev)[name] > 0 }
	}

	// The first request fills the backlog. The CM hands REQs to rdma_cm
	// in the order they arrive, so once the first is received the
	// second finds it queued.
	first := dial()
	require.Eventually(t, counter(srv.dev, "rx_req"), 20*time.Second, time.Millisecond)
	second := dial()
	require.Eventually(t, func() bool { c := rdmacm.Counters(srv.dev); return c["req_dropped"]+c["tx_rej"] > 0 },
		20*time.Second, time.Millisecond, "the second REQ was neither dropped nor refused")
	require.Zero(t, rdmacm.Counters(srv.dev)["tx_rej"], "the REQ over the backlog was refused")
	require.Equal(t, uint64(1), rdmacm.Counters(srv.dev)["req_dropped"])
	for _, m := range tap.messages() {
		_, rej := m.(*mad.REJ)
		require.False(t, rej, "the server answered the REQ over its backlog with a REJ")
	}
	select {
	case d := <-second:
		t.Fatalf("the second Dial returned while its REQ waits for room: %v", d.err)
	default:
	}

	// Accept the first: the backlog has room again.
	a1 := serveOne(ctx, srv, l, nil)
	got := <-a1
	require.NoError(t, got.err)
	d1 := <-first
	require.NoError(t, d1.err)
	require.Equal(t, d1.conn.LocalAddr(), got.conn.RemoteAddr())

	// The only timer left is the second REQ's retransmission.
	require.Equal(t, 1, fc.Pending(), "CM timers armed besides the second REQ's")
	wait, ok := fc.NextDeadline()
	require.True(t, ok)
	a2 := serveOne(ctx, srv, l, nil)
	fc.Advance(wait)
	var a accepted
	select {
	case a = <-a2:
	case <-ctx.Done():
		t.Fatal("the REQ's retransmission never reached Accept")
	}
	require.NoError(t, a.err)
	d2 := <-second
	require.NoError(t, d2.err, "the second Dial completes on its REQ's retry")
	require.Equal(t, d2.conn.LocalAddr(), a.conn.RemoteAddr())

	sc, cc := rdmacm.Counters(srv.dev), rdmacm.Counters(cli.dev)
	require.Equal(t, uint64(1), sc["req_dropped"])
	require.Equal(t, uint64(3), sc["rx_req"], "two REQs and one retransmission")
	require.Zero(t, sc["rx_dup_req"], "the retransmission is a new request")
	require.Zero(t, sc["tx_rej"])
	require.Equal(t, uint64(1), cc["tx_retries_req"])
	require.Zero(t, cc["rx_rej"])

	ctxEnd, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, d1.conn.Disconnect(ctxEnd))
	require.NoError(t, d2.conn.Disconnect(ctxEnd))
}

// TestFullBacklogRefusesTheSIDRREQ: a UD request (SIDR_REQ) that finds
// the listener's backlog full is refused with SIDR_REP REJECT, as cm.c's
// cm_sidr_req_handler answers a SIDR_REQ its consumer fails
// (cm_destroy_id in SIDR_REQ_RCVD), where a REQ is dropped
// (TestFullBacklogDropsTheREQUntilThereIsRoom). Both come from one
// address, which holds the whole backlog of 1, so no eviction makes room
// for the second (it would only swap one request of the source for
// another), decided before the request is queued (listen_backlog.go).
// The request waiting in the backlog is then answered as usual. CM
// follow-up item 3.
func TestFullBacklogRefusesTheSIDRREQ(t *testing.T) {
	hs := memHosts(t, nil, "10.12.1.1", "10.12.1.2")
	srv, cli := hs[0], hs[1]
	fc := cmtest.NewFakeClock(time.Unix(4_100_000, 0)) // no SIDR_REQ is retransmitted
	require.NoError(t, rdmacm.Enable(srv.dev, &rdmacm.Config{Clock: fc}))
	require.NoError(t, rdmacm.Enable(cli.dev, &rdmacm.Config{Clock: fc}))
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.12.1.1:7174"), &rdmacm.ListenOptions{PortSpace: mad.PortSpaceUDP, Backlog: 1})
	require.NoError(t, err)
	defer l.Close()

	type udDialed struct {
		r   *rdmacm.UDRemote
		err error
	}
	first := make(chan udDialed, 1)
	go func() {
		r, err := rdmacm.DialUD(ctx, cli.dev, l.Addr(), nil)
		first <- udDialed{r, err}
	}()
	require.Eventually(t, func() bool { return rdmacm.Counters(srv.dev)["rx_sidr_req"] == 1 },
		20*time.Second, time.Millisecond)

	_, err = rdmacm.DialUD(ctx, cli.dev, l.Addr(), nil)
	var se *rdmacm.SIDRError
	require.ErrorAs(t, err, &se, "the request over the backlog")
	require.Equal(t, mad.SIDRReject, se.Status)

	req, err := l.Accept(ctx)
	require.NoError(t, err)
	require.True(t, req.UD())
	uq := srv.qp(ib.UD)
	require.NoError(t, ib.ConnectQP(uq, ib.RemoteQP{}, ib.ConnectAttr{QKey: 0x01234567}))
	require.NoError(t, req.AcceptUD(uq, 0x01234567, nil))
	d := <-first
	require.NoError(t, d.err, "the queued request is answered")
	require.Equal(t, uq.Num(), d.r.QPN)
	c := rdmacm.Counters(srv.dev)
	require.Equal(t, uint64(2), c["rx_sidr_req"])
	require.Equal(t, uint64(2), c["tx_sidr_rep"], "one REJECT, one answer")
}
