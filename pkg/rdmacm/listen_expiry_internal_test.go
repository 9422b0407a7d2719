package rdmacm

import (
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm/cmtest"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestREQWaitBound: how long a REQ's active side may still wait after
// we received it, by cm.c's timers: Max CM Retries + 1 waits, each the
// larger of its REQ's (2 x packet life time + Remote CM Response
// Timeout, cm_convert_to_ms's 2^(t-8) ms) and the one our MRA sets
// (mraServiceTimeout plus Local ACK Timeout, the active side's
// av.timeout at most), and one round trip for the wait an MRA restarts.
// The packet life time is Local ACK Timeout - 1 (cm_format_paths_from_req).
// Bug reference: rdma_cm listener edges task, item 1.
func TestREQWaitBound(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name                   string
		ack, response, retries uint8
		want                   time.Duration
	}{
		// rdma_cm's REQ (captures: Local ACK Timeout 19, response 20,
		// 15 retries): 16 x max(2 x 1024 + 4096, 4096 + 2048) + 2048.
		{"rdma_cm", 19, 20, 15, 16*6144*ms + 2048*ms},
		// A long response timeout: the REQ's own wait is the longer.
		{"long response", 19, 23, 3, 4*(2048+32768)*ms + 2048*ms},
		// A short path and no retries: our MRA's wait is the longer.
		{"mra longer", 9, 8, 0, (4096+2)*ms + 2*ms},
		// Local ACK Timeout 0: a packet life time of 0 (1 ms).
		{"zero ack", 0, 0, 1, 2*(4096+1)*ms + 2*ms},
	} {
		req := &mad.REQ{RemoteCMResponseTimeout: tc.response, MaxCMRetries: tc.retries,
			Primary: mad.Path{LocalACKTimeout: tc.ack}}
		require.Equal(t, tc.want, reqWaitBound(req), tc.name)
	}
}

// TestQueuedREQResidencyIsCapped: a REQ stays queued until its active
// side has given up (reqWaitBound), but never longer than maxQueuedREQ
// (2 minutes), whatever its fields say; rdma_cm's own REQs, with the
// packet life time of older (18) and later (16) kernels, stay under the
// cap, so an honest rdma_cm peer's request is never cut short.
//
// Bug (rdma_cm listener backlog edges, item 2): a forger's REQ (Remote
// CM Response Timeout 31, 15 retries) stayed queued for about 37 hours.
func TestQueuedREQResidencyIsCapped(t *testing.T) {
	forged := &mad.REQ{RemoteCMResponseTimeout: 31, MaxCMRetries: 15, Primary: mad.Path{LocalACKTimeout: 31}}
	require.Greater(t, reqWaitBound(forged), 37*time.Hour, "what the forger's fields claim")
	require.Equal(t, 2*time.Minute, reqResidency(forged))

	ms := time.Millisecond
	for ack, want := range map[uint8]time.Duration{19: 100352 * ms, 17: 74240 * ms} {
		honest := &mad.REQ{RemoteCMResponseTimeout: 20, MaxCMRetries: 15, Primary: mad.Path{LocalACKTimeout: ack}}
		require.Equal(t, want, reqResidency(honest), "rdma_cm's REQ, Local ACK Timeout %d", ack)
		require.Less(t, want, maxQueuedREQ)
	}
}

// TestSIDRWaitBound: a queued SIDR_REQ's requester has given up 16
// tries of 4096 ms after it (cma_resolve_ib_udp's timeout_ms, 1 <<
// (CMA_CM_RESPONSE_TIMEOUT - 8), and CMA_MAX_CM_RETRIES 15), which is
// DialUD's query too (cm.SIDRParams' defaults). Bug reference: rdma_cm
// listener backlog edges, item 3.
func TestSIDRWaitBound(t *testing.T) {
	require.Equal(t, 65536*time.Millisecond, sidrWaitBound)
}

// TestBacklogExpiry: take and admit take every expired request out of
// the queue, wherever it stands (deadlines differ with the REQs'
// timeouts), hand them back oldest first, and free their sources'
// places; one expires at its deadline, not a nanosecond before; a request
// without a deadline never does. Bug reference: rdma_cm listener
// edges task, item 1.
func TestBacklogExpiry(t *testing.T) {
	t0 := time.Unix(4_500_000, 0)
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	q := newBacklog(4, 4)
	req := func(from netip.Addr, expires time.Duration) *Request {
		r := &Request{peerGID: from}
		if expires > 0 {
			r.expires = t0.Add(expires)
		}
		require.True(t, q.push(r))
		return r
	}
	a1 := req(a, 10*time.Second)
	b1 := req(b, 5*time.Second)
	ud := req(a, 0)
	a2 := req(a, 5*time.Second)

	adm, victim, expired := q.admit(a, t0.Add(5*time.Second-time.Nanosecond))
	require.Equal(t, backlogFull, adm, "nothing expired yet")
	require.Nil(t, victim)
	require.Empty(t, expired)

	adm, _, expired = q.admit(a, t0.Add(5*time.Second))
	require.Equal(t, admitted, adm, "two places freed")
	require.Equal(t, []*Request{b1, a2}, expired)
	require.Zero(t, q.bySrc[b])
	require.Equal(t, 2, q.bySrc[a])

	r, expired := q.take(t0.Add(time.Hour))
	require.Same(t, ud, r, "a request without a deadline never expires")
	require.Equal(t, []*Request{a1}, expired)
	require.Zero(t, q.queued())
	require.Empty(t, q.bySrc)
}

// TestBacklogExpiryTimer: a backlog keeps one timer on its clock, not one
// per request, armed for the earliest deadline; it refuses what expired
// when it fires (onExpire, outside the lock), re-arms for the next, and
// is stopped once no request with a deadline is left (Close's drain).
// Bug reference: rdma_cm listener backlog edges, item 4.
func TestBacklogExpiryTimer(t *testing.T) {
	t0 := time.Unix(4_600_000, 0)
	fc := cmtest.NewFakeClock(t0)
	var got []*Request
	q := newBacklog(8, 0)
	q.expireWith(fc, func(rs []*Request) {
		require.True(t, q.mu.TryLock(), "onExpire runs outside the backlog's lock")
		q.mu.Unlock()
		got = append(got, rs...)
	})
	require.Zero(t, fc.Pending())
	req := func(expires time.Duration) *Request {
		r := &Request{peerGID: netip.MustParseAddr("10.0.0.1")}
		if expires > 0 {
			r.expires = t0.Add(expires)
		}
		require.True(t, q.push(r))
		return r
	}
	late := req(30 * time.Second)
	require.Equal(t, 1, fc.Pending())
	early := req(10 * time.Second)
	req(0) // no deadline
	last := req(40 * time.Second)
	require.Equal(t, 1, fc.Pending(), "one timer for the backlog")
	d, _ := fc.NextDeadline()
	require.Equal(t, 10*time.Second, d, "armed for the earliest deadline")

	fc.Advance(30 * time.Second)
	require.Equal(t, []*Request{early, late}, got, "each at its deadline")
	require.Equal(t, 2, q.queued())
	d, _ = fc.NextDeadline()
	require.Equal(t, 10*time.Second, d, "re-armed for the next")

	require.NotNil(t, q.pop(), "the one without a deadline")
	require.Same(t, last, q.pop())
	require.Zero(t, fc.Pending(), "no timer once nothing can expire")
}
