package rdmacm

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The backlog's rules (listen_backlog.go), request by request: a source
// over the cap set for it is turned away; a full backlog evicts the oldest request
// of the heaviest source (the one whose oldest is oldest among equals)
// only for a source holding at least two fewer, so two sources never
// take a place back and forth. The residual risk of docs/security.md's
// backlog item (TestREQsFromOneSourceTakeAtMostTheCapSetForThem).
func TestBacklogAdmission(t *testing.T) {
	src := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	a, b, c := src("10.0.0.1"), src("10.0.0.2"), src("::ffff:10.0.0.3")
	req := func(from netip.Addr) *Request { return &Request{peerGID: from} }
	q := newBacklog(4, 3)
	// These requests never expire (no deadline).
	admit := func(from netip.Addr) (admission, *Request) {
		t.Helper()
		adm, victim, expired := q.admit(from, time.Time{})
		require.Empty(t, expired)
		return adm, victim
	}
	push := func(from netip.Addr) *Request {
		t.Helper()
		adm, victim := admit(from.Unmap())
		require.Equal(t, admitted, adm)
		require.Nil(t, victim)
		r := req(from)
		require.True(t, q.push(r))
		return r
	}
	a1, a2 := push(a), push(a)
	b1 := push(b)
	push(a)
	adm, _ := admit(a)
	require.Equal(t, sourceFull, adm, "a holds its 3")

	// Full: c holds 0, a (the heaviest, 3) loses its oldest.
	adm, victim := admit(c.Unmap())
	require.Equal(t, admitEvicted, adm)
	require.Same(t, a1, victim)
	c1 := req(c)
	require.True(t, q.push(c1))
	require.Equal(t, 2, q.bySrc[a])

	// a 2, b 1, c 1: b and c hold one fewer than a, not two.
	adm, victim = admit(b)
	require.Equal(t, backlogFull, adm)
	require.Nil(t, victim)
	// A fourth source takes a's oldest place.
	adm, victim = admit(src("10.0.0.4"))
	require.Equal(t, admitEvicted, adm)
	require.Same(t, a2, victim)
	require.True(t, q.push(req(src("10.0.0.4"))))

	// One each: nobody is evicted for anybody.
	adm, _ = admit(src("10.0.0.5"))
	require.Equal(t, backlogFull, adm)
	require.Same(t, b1, q.pop(), "Accept takes the oldest first")
	require.Equal(t, 3, q.queued())
	require.Zero(t, q.bySrc[b])

	// No cap is the default, and so is one of the backlog or more.
	require.Zero(t, newBacklog(64, 0).perSource)
	require.Zero(t, newBacklog(4, 4).perSource)
	require.Zero(t, newBacklog(4, 100).perSource)
	require.Equal(t, 3, newBacklog(4, 3).perSource)
}
