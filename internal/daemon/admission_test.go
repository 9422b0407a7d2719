package daemon

import (
	"net/netip"
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
