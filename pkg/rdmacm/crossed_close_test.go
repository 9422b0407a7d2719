package rdmacm_test

import (
	"testing"
	"time"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/cm/cmtest"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// lingeringHost is a host whose CM runs on a clock only the test moves
// and whose device close lingers an hour: a close that returns waited
// for no timewait.
func lingeringHost(t *testing.T, net *transport.MemNetwork, ip string, tap *madTap) (*host, *cmtest.FakeClock) {
	t.Helper()
	h := openMemHost(t, net, ip, tap)
	clock := cmtest.NewFakeClock(time.Unix(0, 0))
	require.NoError(t, rdmacm.Enable(h.dev, &rdmacm.Config{Clock: clock, Linger: time.Hour}))
	// Runs before openHost's close: a failed test's lingering close ends
	// with timewait.
	t.Cleanup(func() { clock.Advance(time.Minute) })
	return h, clock
}

// holdFirstDREQ makes tap hold back the first DREQ its device sends and
// returns a channel closed once it has.
func holdFirstDREQ(tap *madTap) <-chan struct{} {
	held := make(chan struct{})
	first := true // under tap.mu, as hold runs
	tap.mu.Lock()
	defer tap.mu.Unlock()
	tap.hold = func(m mad.Message) bool {
		if _, ok := m.(*mad.DREQ); !ok || !first {
			return false
		}
		first = false
		close(held)
		return true
	}
	return held
}

// TestCrossedDisconnectClosesWithoutLinger: both sides disconnect at once,
// their DREQs crossing (each held until the other's is out); each answers
// the other's DREQ and then gets the DREP to its own, after which it owes
// the peer nothing (the peer cancelled its DREQ when ours arrived), so
// both devices close at once, whatever their linger. Bug (session AJ):
// pkg/cm dropped that DREP as a duplicate without an event, and a crossed
// disconnect lingered through the whole timewait, as a connection that
// only answered the peer's DREQ must.
func TestCrossedDisconnectClosesWithoutLinger(t *testing.T) {
	t.Parallel()
	net := transport.NewMemNetwork()
	tapS, tapC := &madTap{}, &madTap{}
	srv, _ := lingeringHost(t, net, "10.56.0.1", tapS)
	cli, _ := lingeringHost(t, net, "10.56.0.2", tapC)
	ctx := testCtx(t)

	l, err := rdmacm.Listen(srv.dev, ap("10.56.0.1:7471"), nil)
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan *rdmacm.Conn, 1)
	go func() {
		var c *rdmacm.Conn
		if req, err := l.Accept(ctx); err == nil {
			c, _ = req.Accept(ctx, srv.qp(ib.RC), nil)
		}
		accepted <- c
	}()
	cc, err := rdmacm.Dial(ctx, cli.qp(ib.RC), ap("10.56.0.1:7471"), nil)
	require.NoError(t, err)
	sc := <-accepted
	require.NotNil(t, sc)

	heldS, heldC := holdFirstDREQ(tapS), holdFirstDREQ(tapC)
	disconnected := make(chan error, 2)
	for _, c := range []*rdmacm.Conn{sc, cc} {
		go func() { disconnected <- c.Disconnect(ctx) }()
	}
	<-heldS
	<-heldC // both DREQs are out: each side is in DREQ_SENT
	require.NoError(t, tapS.release())
	require.NoError(t, tapC.release())
	require.NoError(t, <-disconnected)
	require.NoError(t, <-disconnected)
	require.ErrorIs(t, sc.Err(), rdmacm.ErrDisconnected)
	require.ErrorIs(t, cc.Err(), rdmacm.ErrDisconnected)

	require.True(t, testenv.ReturnsWithin(func() { _ = cli.dev.Close() }, 10*time.Second),
		"the client's device close lingered after its crossed DREQ was answered (CM counters %v)", rdmacm.Counters(cli.dev))
	require.True(t, testenv.ReturnsWithin(func() { _ = srv.dev.Close() }, 10*time.Second),
		"the server's device close lingered after its crossed DREQ was answered")
	// The wire is cm.c's: one DREQ and one DREP from each side.
	for _, tap := range []*madTap{tapS, tapC} {
		var dreqs, dreps int
		for _, m := range tap.messages() {
			switch m.(type) {
			case *mad.DREQ:
				dreqs++
			case *mad.DREP:
				dreps++
			}
		}
		require.Equal(t, [2]int{1, 1}, [2]int{dreqs, dreps}, "DREQs and DREPs sent")
	}
}
