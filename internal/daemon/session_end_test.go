package daemon

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/wire"
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

// logWatch is a slog handler that lets a test wait for a message.
type logWatch struct {
	mu   sync.Mutex
	msgs []string
	ch   chan struct{} // closed and replaced at each record
}

func newLogWatch() *logWatch { return &logWatch{ch: make(chan struct{})} }

func (w *logWatch) Enabled(context.Context, slog.Level) bool { return true }
func (w *logWatch) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *logWatch) WithGroup(string) slog.Handler            { return w }
func (w *logWatch) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, r.Message)
	close(w.ch)
	w.ch = make(chan struct{})
	return nil
}

// waitFor waits until msg has been logged n times.
func (w *logWatch) waitFor(t *testing.T, msg string, n int) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		w.mu.Lock()
		got := 0
		for _, m := range w.msgs {
			if m == msg {
				got++
			}
		}
		ch := w.ch
		w.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("%q was not logged %d times", msg, n)
		}
	}
}

// TestSessionsAnnouncingOneQPKeepTheirBudgets: two sessions of one
// client announce the same QP (its QPN at its own address). Bug (found
// by the daemon audit, session AF): the second session's accounting
// replaced the first's, and its end deleted the entry, so everything the
// daemon sent to that QP afterwards went unaccounted: the first session's
// --session-bytes no longer bounded anything, and a client could have
// unlimited READs by opening and closing a second session. Now the
// second session is refused at the QP, and a session's end forgets only
// its own entries.
func TestSessionsAnnouncingOneQPKeepTheirBudgets(t *testing.T) {
	logs := newLogWatch()
	const budget = 1 << 20
	d, err := New(Config{Addrs: addrs(t, "127.0.3.231"), OOBAddr: "127.0.3.231:0", IdleTimeout: -1, SessionBytes: budget,
		Logger: slog.New(logs), Exports: []ExportSpec{{Name: "data", Kind: ExportAnon, Size: 1 << 20}}})
	require.NoError(t, err)
	runDaemon(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	perftestClient(t, ctx, d) // announces QP 0x42
	logs.waitFor(t, "perftest client connected", 1)

	// The second session: the same QP; it is over (failed) once its
	// client has gone.
	dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}
	c, err := dl.DialContext(ctx, "tcp", d.OOBAddr().String())
	require.NoError(t, err)
	s := oob.NewSession(c, oob.Client, &oob.SessionConfig{Options: oob.Options{Timeout: 10 * time.Second}})
	_, err = s.Negotiate(ctx, 3)
	require.NoError(t, err)
	key := oob.Key{OutReads: 1, QPN: 0x42, PSN: 7, RKey: 1, VAddr: 0x1000, GID: netip.MustParseAddr("127.0.0.1").As16()}
	for range 3 {
		if _, err := s.HandShake(ctx, key); err != nil {
			break // refused
		}
	}
	_ = s.CloseWithoutExchange()
	logs.waitFor(t, "perftest session failed", 1)

	// What the daemon sends the first session's QP is still within its
	// budget.
	hdr := make([]byte, wire.BTHLen)
	wire.BTH(hdr).SetDestQP(0x42)
	require.False(t, d.traffic.allowTx(hdr, budget+1, netip.MustParseAddr("127.0.0.1")),
		"a datagram past the first session's budget was let through: its QP is no longer accounted")
	require.Equal(t, uint64(1), d.traffic.budgetDrops.Load())
}
