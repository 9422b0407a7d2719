package rdmacm_test

import (
	"context"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/cm/cmtest"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rdmaCMGaveUp is how long after its REQ arrived a Dial's active side
// has given up for sure (listen_expiry.go's reqWaitBound for the REQ
// Dial sends, rdma_cm's: Local ACK Timeout 19, so a packet life time of
// 1.024 s; Remote CM Response Timeout 20, 4.096 s; 15 retries): 16 waits
// of 6.144 s (2 x 1.024 + 4.096, and our MRA's 4.096 + 2.048 alike) and
// a round trip of 2.048 s.
const rdmaCMGaveUp = 100352 * time.Millisecond

// expiryHosts opens the listener's host and n peers, each with a CM
// clock of its own: the listener's clock is returned, and the peers'
// never move, so their REQs go out once and are never retransmitted (a
// forger's, or a client's whose retransmissions we do not need).
func expiryHosts(t *testing.T, addrs ...string) ([]*host, *cmtest.FakeClock) {
	hs := memHosts(t, nil, addrs...)
	var srvClock *cmtest.FakeClock
	for i, h := range hs {
		fc := cmtest.NewFakeClock(time.Unix(int64(4_400_000+i), 0))
		if i == 0 {
			srvClock = fc
		}
		require.NoError(t, rdmacm.Enable(h.dev, &rdmacm.Config{Clock: fc}))
	}
	return hs, srvClock
}

// TestAcceptSkipsAnExpiredRequest: Accept skips a queued request whose
// active side has given up by its REQ's timeouts (the CM's clock has
// passed reqWaitBound since it arrived), refusing it with REJ 28
// (consumer defined), what cm.c's cm_destroy_id sends for an unanswered
// request, counted req_expired, and returns the real client's request
// queued behind it; a nanosecond before the bound the request is still
// handed out.
//
// Bug (rdma_cm listener edges task, item 1): a request waited in the
// backlog for ever, so forged REQs (or clients long gone) were handed to
// an application accepting one at a time, which spent a REP timeout on
// each before reaching a real client.
func TestAcceptSkipsAnExpiredRequest(t *testing.T) {
	hs, fc := expiryHosts(t, "10.12.6.1", "10.12.6.2", "10.12.6.3")
	srv, forger, cli := hs[0], hs[1], hs[2]
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.12.6.1:7482"), &rdmacm.ListenOptions{Backlog: 4})
	require.NoError(t, err)
	defer l.Close()

	results, _ := flooder(t, forger, l.Addr(), 2)
	require.Eventually(t, func() bool { return rdmacm.Queued(l) == 2 }, 20*time.Second, time.Millisecond)
	fc.Advance(10 * time.Second)
	cliDial := make(chan dialed, 1)
	go func() {
		c, err := rdmacm.Dial(ctx, cli.qp(ib.RC), l.Addr(), nil)
		cliDial <- dialed{c, err}
	}()
	require.Eventually(t, func() bool { return rdmacm.Queued(l) == 3 }, 20*time.Second, time.Millisecond)

	// A nanosecond before the bound the forger may still be waiting.
	fc.Advance(rdmaCMGaveUp - 10*time.Second - time.Nanosecond)
	req, err := l.Accept(ctx)
	require.NoError(t, err)
	require.Equal(t, forger.ip, req.Remote.Addr(), "the oldest request, not expired yet")
	require.NoError(t, req.Reject(nil))
	require.Zero(t, rdmacm.Counters(srv.dev)["req_expired"])

	fc.Advance(time.Nanosecond)
	req, err = l.Accept(ctx)
	require.NoError(t, err)
	require.Equal(t, cli.ip, req.Remote.Addr(), "Accept skipped the forger's expired request")
	require.Equal(t, uint64(1), rdmacm.Counters(srv.dev)["req_expired"])
	for range 2 {
		var rej *rdmacm.RejectError
		require.ErrorAs(t, <-results, &rej, "the forger's Dials are refused")
		require.Equal(t, mad.REJConsumerDefined, rej.Reason)
	}

	conn, err := req.Accept(ctx, srv.qp(ib.RC), nil)
	require.NoError(t, err)
	d := <-cliDial
	require.NoError(t, d.err, "the real client connects on its first REQ")
	require.Equal(t, d.conn.LocalAddr(), conn.RemoteAddr())
	require.Zero(t, rdmacm.Queued(l))
}

// TestExpiredRequestsMakeRoom: a backlog full of requests whose active
// sides have given up takes a new REQ: the expired ones are refused (REJ
// 28, req_expired) as it arrives, instead of dropping it as over a full
// backlog while nobody calls Accept. Here two forged sources hold one
// place each, so no eviction could make room (a source must hold two
// more than the newcomer).
//
// Bug (rdma_cm listener edges task, item 1): see
// TestAcceptSkipsAnExpiredRequest; the real client's REQ was dropped
// (req_dropped) until the application had accepted both dead requests.
func TestExpiredRequestsMakeRoom(t *testing.T) {
	hs, fc := expiryHosts(t, "10.12.7.1", "10.12.7.2", "10.12.7.3", "10.12.7.4")
	srv, f1, f2, cli := hs[0], hs[1], hs[2], hs[3]
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.12.7.1:7483"), &rdmacm.ListenOptions{Backlog: 2, MaxPerSource: 1})
	require.NoError(t, err)
	defer l.Close()

	r1, _ := flooder(t, f1, l.Addr(), 1)
	r2, _ := flooder(t, f2, l.Addr(), 1)
	require.Eventually(t, func() bool { return rdmacm.Queued(l) == 2 }, 20*time.Second, time.Millisecond)
	fc.Advance(rdmaCMGaveUp)

	cliDial := make(chan dialed, 1)
	go func() {
		c, err := rdmacm.Dial(ctx, cli.qp(ib.RC), l.Addr(), nil)
		cliDial <- dialed{c, err}
	}()
	backlogSettles(t, srv, l, func(ct *assert.CollectT, c map[string]uint64, queued int) {
		assert.Equal(ct, uint64(3), c["rx_req"])
		assert.Equal(ct, uint64(2), c["req_expired"], "both dead requests refused")
		assert.Zero(ct, c["req_dropped"], "the client's REQ was not dropped")
		assert.Zero(ct, c["req_evicted"])
		assert.Equal(ct, 1, queued, "the client's request")
	})
	for _, res := range []<-chan error{r1, r2} {
		var rej *rdmacm.RejectError
		require.ErrorAs(t, <-res, &rej)
		require.Equal(t, mad.REJConsumerDefined, rej.Reason)
	}

	a := acceptFrom(ctx, srv, l, cli.ip)
	d := <-cliDial
	require.NoError(t, d.err, "the real client connects on its first REQ")
	got := <-a
	require.NoError(t, got.err)
	require.Equal(t, d.conn.LocalAddr(), got.conn.RemoteAddr())
}

// TestForgedREQTimeoutsAreCapped: a REQ whose fields claim its sender
// waits for hours (Remote CM Response Timeout 31, packet life time 30,
// 15 retries: about 37 hours by reqWaitBound) stays queued 2 minutes at
// most (maxQueuedREQ, above rdma_cm's own 100 s), then is refused with
// REJ 28 (consumer defined) and counted req_expired: Accept, called with
// its ctx already done, takes it out and returns no request.
//
// Bug (rdma_cm listener backlog edges, item 2): the forger's choice kept
// the request queued for about 37 hours, handed to Accept all that time.
func TestForgedREQTimeoutsAreCapped(t *testing.T) {
	hs, fc := expiryHosts(t, "10.12.8.1", "10.12.8.2")
	srv, forger := hs[0], hs[1]
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.12.8.1:7485"), nil)
	require.NoError(t, err)
	defer l.Close()

	answer := make(chan cm.Event, 1)
	q := forger.qp(ib.RC)
	go func() {
		ev, err := rdmacm.DialREQ(ctx, q, l.Addr(), nil, func(p *cm.ConnectParams) {
			p.PacketLifeTime, p.RemoteCMResponseTimeout, p.MaxCMRetries = 30, 31, 15
		})
		if err != nil {
			ev = cm.Event{Type: cm.EventTimeout}
		}
		answer <- ev
	}()
	require.Eventually(t, func() bool { return rdmacm.Queued(l) == 1 }, 20*time.Second, time.Millisecond)

	fc.Advance(2 * time.Minute)
	requireOneExpired(t, ctx, srv, l, "the forged one")
	ev := <-answer
	require.Equal(t, cm.EventREJ, ev.Type, "the forger is refused")
	require.Equal(t, mad.REJConsumerDefined, ev.Reason)
}

// TestQueuedSIDRREQExpires: a SIDR_REQ queued in a UD listener's backlog
// expires once rdma_cm's requester has given up (16 tries of 4096 ms,
// 65.5 s after it came): it is refused with SIDR_REP REJECT, as the
// backlog's other refusals of a SIDR_REQ, counted req_expired, and Accept
// no longer hands it out.
//
// Bug (rdma_cm listener backlog edges, item 3): SIDR requests never
// expired, so a SIDR_REQ forged once sat in the backlog until the
// application accepted it.
func TestQueuedSIDRREQExpires(t *testing.T) {
	hs, fc := expiryHosts(t, "10.12.9.1", "10.12.9.2")
	srv, cli := hs[0], hs[1]
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.12.9.1:7486"), &rdmacm.ListenOptions{PortSpace: mad.PortSpaceUDP})
	require.NoError(t, err)
	defer l.Close()

	dialErr := make(chan error, 1)
	go func() {
		_, err := rdmacm.DialUD(ctx, cli.dev, l.Addr(), nil) // its clock stands still: one SIDR_REQ
		dialErr <- err
	}()
	require.Eventually(t, func() bool { return rdmacm.Queued(l) == 1 }, 20*time.Second, time.Millisecond)

	fc.Advance(65536 * time.Millisecond)
	requireOneExpired(t, ctx, srv, l, "the SIDR_REQ")
	var se *rdmacm.SIDRError
	require.ErrorAs(t, <-dialErr, &se, "the requester is refused")
	require.Equal(t, mad.SIDRReject, se.Status)
}

// TestQueuedRequestsExpireWithoutTraffic: with no new request and no
// Accept, a queued request is refused (REJ 28, req_expired) when its
// deadline passes on the CM's clock, and the next one's when its own
// does: the backlog's timer re-arms for the earliest deadline left.
// A nanosecond before a deadline nothing is refused.
//
// Bug (rdma_cm listener backlog edges, item 4): expiry was only checked
// when a request arrived or Accept ran, so an idle listener's dead
// requests kept their places, and the device's half-open places
// (MaxHalfOpen, shared by every listener), and their peers got no REJ.
func TestQueuedRequestsExpireWithoutTraffic(t *testing.T) {
	hs, fc := expiryHosts(t, "10.12.10.1", "10.12.10.2", "10.12.10.3")
	srv, f1, f2 := hs[0], hs[1], hs[2]
	l, err := rdmacm.Listen(srv.dev, ap("10.12.10.1:7487"), nil)
	require.NoError(t, err)
	defer l.Close()

	r1, _ := flooder(t, f1, l.Addr(), 1)
	require.Eventually(t, func() bool { return rdmacm.Queued(l) == 1 }, 20*time.Second, time.Millisecond)
	fc.Advance(10 * time.Second)
	r2, _ := flooder(t, f2, l.Addr(), 1)
	require.Eventually(t, func() bool { return rdmacm.Queued(l) == 2 }, 20*time.Second, time.Millisecond)

	fc.Advance(rdmaCMGaveUp - 10*time.Second - time.Nanosecond)
	require.Equal(t, 2, rdmacm.Queued(l), "nothing expired yet")
	require.Zero(t, rdmacm.Counters(srv.dev)["req_expired"])

	fc.Advance(time.Nanosecond)
	require.Equal(t, 1, rdmacm.Queued(l), "the first expired by itself")
	require.Equal(t, uint64(1), rdmacm.Counters(srv.dev)["req_expired"])
	var rej *rdmacm.RejectError
	require.ErrorAs(t, <-r1, &rej, "its Dial is refused")
	require.Equal(t, mad.REJConsumerDefined, rej.Reason)

	fc.Advance(10*time.Second - time.Nanosecond)
	require.Equal(t, 1, rdmacm.Queued(l))
	fc.Advance(time.Nanosecond)
	require.Zero(t, rdmacm.Queued(l), "the second at its own deadline")
	require.Equal(t, uint64(2), rdmacm.Counters(srv.dev)["req_expired"])
	require.ErrorAs(t, <-r2, &rej)
	require.Equal(t, mad.REJConsumerDefined, rej.Reason)
}

// requireOneExpired checks that l's one queued request (what) expired:
// Accept has nothing to hand out, the backlog is empty and req_expired
// counts it.
func requireOneExpired(t *testing.T, ctx context.Context, srv *host, l *rdmacm.Listener, what string) {
	t.Helper()
	done, cancel := context.WithCancel(ctx)
	cancel()
	req, err := l.Accept(done)
	require.ErrorIs(t, err, context.Canceled, "no request: %s expired", what)
	require.Nil(t, req)
	require.Equal(t, uint64(1), rdmacm.Counters(srv.dev)["req_expired"])
	require.Zero(t, rdmacm.Queued(l))
}
