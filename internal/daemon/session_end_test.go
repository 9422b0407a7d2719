package daemon

import (
	"context"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/oob"
	"github.com/stretchr/testify/require"
)

// fakeClock is a daemon clock the test moves (atomic: the engine's
// receive path reads it too).
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Now().UnixNano()) // the wall clock's time, then the test's
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// runDaemon starts d.Run; stop cancels it and returns Run's error once
// Run has returned (every session over).
func runDaemon(t *testing.T, d *Daemon) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var err error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			err = <-done
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// perftestClient connects to the daemon's exchange from 127.0.0.1 and
// completes a write bandwidth test's exchange up to the run (its key
// announces its own address), as ib_write_bw does.
func perftestClient(t *testing.T, ctx context.Context, d *Daemon) *oob.Session {
	t.Helper()
	dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}
	c, err := dl.DialContext(ctx, "tcp", d.OOBAddr().String())
	require.NoError(t, err)
	s := oob.NewSession(c, oob.Client, &oob.SessionConfig{Options: oob.Options{Timeout: 10 * time.Second}})
	t.Cleanup(func() { _ = s.CloseWithoutExchange() })
	_, err = s.Negotiate(ctx, 3)
	require.NoError(t, err)
	key := oob.Key{OutReads: 1, QPN: 0x42, PSN: 1, RKey: 1, VAddr: 0x1000, GID: netip.MustParseAddr("127.0.0.1").As16()}
	for range 3 { // its QP's address, then the two barriers
		_, err := s.HandShake(ctx, key)
		require.NoError(t, err)
	}
	return s
}

// TestSessionFailingAfterItsHandshakeIsNoHandshakeTimeout: a client that
// finishes the exchange, runs for longer than the handshake timeout and
// then vanishes (killed mid-run) fails its session; that is not a
// handshake that ran out of time. Bug (found by the daemon audit, session
// AF): the session counted it in rxed_sessions_handshake_timeouts_total
// and logged "handshake timed out after 5s" whenever the failure came
// later than the handshake's deadline, whatever the phase, and compared
// that real-time deadline with the daemon's injected clock.
func TestSessionFailingAfterItsHandshakeIsNoHandshakeTimeout(t *testing.T) {
	clk := newFakeClock()
	d, err := New(Config{Addrs: addrs(t, "127.0.3.230"), OOBAddr: "127.0.3.230:0", Now: clk.Now, IdleTimeout: -1,
		Exports: []ExportSpec{{Name: "data", Kind: ExportAnon, Size: 1 << 20}}})
	require.NoError(t, err)
	stop := runDaemon(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := perftestClient(t, ctx, d)
	clk.Advance(time.Hour) // the run: an hour
	require.NoError(t, s.CloseWithoutExchange())
	require.NoError(t, stop()) // waits for the session's end (the grace period)
	require.Equal(t, uint64(1), d.failed.Load())
	require.Zero(t, d.hsTimeouts.Load(), "a session that failed after its exchange counted as a handshake timeout")
}
