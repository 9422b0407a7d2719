package main

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/daemon"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/stretchr/testify/require"
)

// idleClientQPN numbers the idle clients' QPs.
var idleClientQPN atomic.Uint32

// idleClient is a perftest-speaking client from address from that
// completes the exchange of a write bandwidth test (its QP connected, the
// rkey granted) and then does nothing: it holds a session slot.
func idleClient(t *testing.T, ctx context.Context, oobAddr, from string) *oob.Session {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.DialContext(ctx, "tcp", oobAddr)
	require.NoError(t, err)
	s := oob.NewSession(c, oob.Client, &oob.SessionConfig{Options: oob.Options{Timeout: 10 * time.Second}})
	t.Cleanup(func() { s.CloseWithoutExchange() })
	_, err = s.Negotiate(ctx, 3)
	require.NoError(t, err)
	// A QP of its own: the daemon refuses a QP another session is
	// connected to.
	key := oob.Key{OutReads: 1, QPN: idleClientQPN.Add(1), PSN: 1, RKey: 1, VAddr: 0x1000, GID: netip.MustParseAddr(from).As16()}
	for range 3 { // its QP's address, then the two barriers
		_, err := s.HandShake(ctx, key)
		require.NoError(t, err)
	}
	return s
}

// TestServeIdleSessionsReclaimed: clients that finish the exchange and go
// silent held every slot forever (64 of them locked the daemon for good).
// Now they are reclaimed once their QPs have been silent for
// --idle-timeout, while a legitimate client that runs longer than the
// timeout is served throughout; a client that comes while every slot is
// taken is told "server busy", and one that comes after the reclaim runs.
func TestServeIdleSessionsReclaimed(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	c, e := addrPair(t)
	port, mport := reservePort(t), reservePort(t)
	d, logs, _, _ := startServe(t, "--addr", a, "-p", port, "--export", "data=anon,size=1M", "--timeout", "5s",
		"--max-sessions", "5", "--idle-timeout", "2s", "--metrics", "127.0.0.1:"+mport)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	oobAddr := net.JoinHostPort(a, port)
	var idle []*oob.Session
	for range 4 {
		idle = append(idle, idleClient(t, ctx, oobAddr, c))
	}
	logs.waitForCount(t, "perftest client connected", 4, 10*time.Second)

	// The legitimate client runs for 4 s, twice the idle timeout.
	_, _, legit := startCmd("perf", "write", "--addr", b, "-p", port, "-s", "4096", "-D", "4", "--progress", "0", a)
	logs.waitForCount(t, "perftest client connected", 5, 10*time.Second)
	busy := runCmd("perf", "write", "--addr", e, "-p", port, "-s", "4096", "-n", "10", "--progress", "0", a)
	require.NotEqual(t, 0, busy.code)
	require.Contains(t, busy.stderr, "server busy")

	// The reaper's own line: the session's end is logged too, with
	// errIdle's text ("idle session reclaimed: ...") as its err, so the
	// bare phrase counted two lines per reclaim and the test went on
	// with two idle sessions not yet reclaimed (CI, twice).
	logs.waitForCount(t, `msg="idle session reclaimed"`, 4, 10*time.Second)
	for i, s := range idle {
		_, err := s.Finish(ctx, oob.Test{Verb: oob.VerbWrite}, oob.Key{}, oob.BWReport{})
		require.ErrorIs(t, err, oob.ErrClosed, "idle client %d: the daemon closed its session", i)
	}
	requireOK(t, "the legitimate client", await(t, legit, 30*time.Second))
	after := runCmd("perf", "write", "--addr", b, "-p", port, "-s", "4096", "-n", "100", "--progress", "0", a)
	requireOK(t, "a client after the reclaim", after)
	waitMetric(t, d, "rxed_sessions_completed_total 2")
	m := d.Metrics()
	require.Contains(t, m, "rxed_sessions_idle_reclaimed_total 4")
	require.Contains(t, m, "rxed_sessions_refused_busy_total 1")
}

// TestServeHandshakeTimeout: silent TCP connections held every slot for
// the 30 s step timeout; now --handshake-timeout reclaims them and the
// client that waited is served.
func TestServeHandshakeTimeout(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port := reservePort(t)
	d, logs, _, _ := startServe(t, "--addr", a, "-p", port, "--export", "data=anon,size=1M",
		"--max-sessions", "3", "--handshake-timeout", "500ms")
	for range 3 {
		c, err := net.Dial("tcp", net.JoinHostPort(a, port))
		require.NoError(t, err)
		defer c.Close()
	}
	logs.waitForCount(t, "handshake timed out", 3, 10*time.Second)
	w := runCmd("perf", "write", "--addr", b, "-p", port, "-s", "4096", "-n", "100", "--progress", "0", a)
	requireOK(t, "perf write after the silent clients", w)
	waitMetric(t, d, "rxed_sessions_handshake_timeouts_total 3")
}

// TestServePerSourceLimit: --max-sessions-per-source keeps one address
// from taking every slot: its next client is told "server busy", while a
// client from another address is served.
func TestServePerSourceLimit(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	c, _ := addrPair(t)
	port := reservePort(t)
	_, logs, _, _ := startServe(t, "--addr", a, "-p", port, "--export", "data=anon,size=1M", "--max-sessions-per-source", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// perf's connection to a comes from 127.0.0.1 (lo's source address).
	idleClient(t, ctx, net.JoinHostPort(a, port), "127.0.0.1")
	logs.waitFor(t, "perftest client connected", 10*time.Second)
	busy := runCmd("perf", "write", "--addr", b, "-p", port, "-s", "4096", "-n", "10", "--progress", "0", a)
	require.NotEqual(t, 0, busy.code)
	require.Contains(t, busy.stderr, "server busy")
	idleClient(t, ctx, net.JoinHostPort(a, port), c)
	logs.waitForCount(t, "perftest client connected", 2, 10*time.Second)
}

// waitMetric waits until the daemon's metrics contain line (a session's
// counters are updated a moment after its client has gone).
func waitMetric(t *testing.T, d *daemon.Daemon, line string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(d.Metrics(), line+"\n") {
		if time.Now().After(deadline) {
			t.Fatalf("metrics never showed %q:\n%s", line, d.Metrics())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestServeGraceZeroEndsSessionsAtOnce: --grace 0 gives running sessions
// no time: the daemon stops as soon as it is told to. Bug (found by the
// daemon audit, session AF): 0 was the daemon's "default" and became 10
// s, so `--grace 0` waited longer than `--grace 1ms` (and a negative
// grace was taken as none).
func TestServeGraceZeroEndsSessionsAtOnce(t *testing.T) {
	t.Parallel()
	a, c := addrPair(t)
	port := reservePort(t)
	_, logs, stop, done := startServe(t, "--addr", a, "-p", port, "--export", "data=anon,size=1M", "--grace", "0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	idleClient(t, ctx, net.JoinHostPort(a, port), c) // its session waits for its report
	logs.waitFor(t, "perftest client connected", 10*time.Second)
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second): // the bug: 10 s
		t.Fatal("serve --grace 0 let the running session go on")
	}
	require.Contains(t, logs.String(), "grace period over")

	var errOut strings.Builder
	_, code, ok := parseServe([]string{"--addr", a, "--export", "data=anon,size=1M", "--grace", "-1s"}, &errOut)
	require.False(t, ok)
	require.Equal(t, 2, code)
	require.Contains(t, errOut.String(), "--grace -1s")
}
