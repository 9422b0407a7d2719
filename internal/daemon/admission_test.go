package daemon

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func newSession(peer string) *session {
	return &session{peer: netip.MustParseAddr(peer), traffic: &sessionTraffic{}}
}

func TestRegistryLimits(t *testing.T) {
	r := newRegistry(3, 2)
	a1, a2, a3, b1, b2 := newSession("10.0.0.1"), newSession("10.0.0.1"), newSession("10.0.0.1"), newSession("10.0.0.2"), newSession("10.0.0.3")
	require.True(t, r.admit(a1))
	require.True(t, r.admit(a2))
	require.False(t, r.admit(a3), "per-source limit")
	require.True(t, r.admit(b1))
	require.False(t, r.admit(b2), "global limit")
	r.release(a1)
	r.release(a1) // twice is harmless
	require.True(t, r.admit(a3))
	require.Equal(t, 3, r.count())
	r.release(a2)
	r.release(a3)
	r.release(b1)
	require.Empty(t, r.bySource)
	require.Zero(t, r.count())
}

// TestRegistryIdle: with an injected clock, an established session whose
// QPs saw nothing for the timeout is found once; traffic (lastRx) keeps a
// session alive; a session still in its handshake is the handshake
// timeout's business, not the idle timeout's.
func TestRegistryIdle(t *testing.T) {
	r := newRegistry(8, 0)
	t0 := time.Unix(5000, 0)
	idle, busy, hs := newSession("10.0.0.1"), newSession("10.0.0.2"), newSession("10.0.0.3")
	for _, s := range []*session{idle, busy, hs} {
		require.True(t, r.admit(s))
	}
	r.establish(idle, t0)
	r.establish(busy, t0)
	const timeout = 10 * time.Second
	require.Empty(t, r.idle(t0.Add(timeout-time.Nanosecond), timeout))
	busy.traffic.lastRx.Store(t0.Add(5 * time.Second).UnixNano())
	got := r.idle(t0.Add(timeout), timeout)
	require.Equal(t, []*session{idle}, got)
	require.Empty(t, r.idle(t0.Add(timeout+time.Second), timeout), "found once")
	require.Equal(t, []*session{busy}, r.idle(t0.Add(15*time.Second), timeout))
	require.Empty(t, r.idle(t0.Add(time.Hour), timeout), "not established: never idle")
}

func TestAllowed(t *testing.T) {
	require.True(t, allowed(nil, netip.MustParseAddr("192.0.2.1")))
	allow := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	require.True(t, allowed(allow, netip.MustParseAddr("10.1.2.3")))
	require.True(t, allowed(allow, netip.MustParseAddr("::ffff:10.1.2.3")), "IPv4-mapped")
	require.True(t, allowed(allow, netip.MustParseAddr("fd12::1")))
	require.False(t, allowed(allow, netip.MustParseAddr("11.0.0.1")))
	require.False(t, allowed(allow, netip.MustParseAddr("::1")))
}

// TestReapIdleClosesTheExchangeBeforeItSaysSo: the reaper logged a
// reclaim and only then cancelled the session, whose goroutine could
// still read its client's next message and answer it (CI, on a loaded
// host: TestServeIdleSessionsReclaimed's idle client got its Finish
// answered). Once reapIdle has returned (and the reclaim is logged), the
// session's context carries errIdle and its exchange connection is closed;
// a session with traffic is left alone.
func TestReapIdleClosesTheExchangeBeforeItSaysSo(t *testing.T) {
	t0 := time.Unix(5000, 0)
	var logged strings.Builder
	d := &Daemon{cfg: Config{IdleTimeout: time.Second}, reg: newRegistry(4, 0), log: slog.New(slog.NewTextHandler(&logged, nil))}
	type end struct {
		s      *session
		ctx    context.Context
		client net.Conn
	}
	open := func(peer string) end {
		s := newSession(peer)
		var ctx context.Context
		ctx, s.cancel = context.WithCancelCause(context.Background())
		server, client := net.Pipe()
		s.closeExchange = func() { _ = server.Close() }
		require.True(t, d.reg.admit(s))
		d.reg.establish(s, t0)
		return end{s, ctx, client}
	}
	idle, busy := open("10.0.0.1"), open("10.0.0.2")
	busy.s.traffic.lastRx.Store(t0.Add(time.Second).UnixNano())

	require.Equal(t, 1, d.reapIdle(t0.Add(time.Second)))
	require.ErrorIs(t, context.Cause(idle.ctx), errIdle)
	_ = idle.client.SetDeadline(time.Now().Add(time.Second)) // unfixed: the write would wait for a reader
	_, err := idle.client.Write([]byte("finish"))
	require.ErrorIs(t, err, io.ErrClosedPipe, "the reclaimed session's exchange is closed")
	require.Contains(t, logged.String(), "idle session reclaimed")
	require.Equal(t, uint64(1), d.reclaimed.Load())

	require.NoError(t, busy.ctx.Err(), "a session with traffic runs on")
	require.Zero(t, d.reapIdle(t0.Add(time.Second+time.Millisecond)), "found once; the other is not idle yet")
}
