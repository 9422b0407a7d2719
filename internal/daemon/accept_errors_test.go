package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/oob"
)

// scriptedTCPListener is a TCP exchange listener whose Accept returns the
// errors the test sends on errs, and otherwise waits for its context (or
// Close) as oob.PerftestListener does.
type scriptedTCPListener struct {
	errs   chan error
	closed chan struct{}
}

func newScriptedTCPListener() *scriptedTCPListener {
	return &scriptedTCPListener{errs: make(chan error), closed: make(chan struct{})}
}

func (l *scriptedTCPListener) Accept(ctx context.Context) (*oob.Session, error) {
	select {
	case err := <-l.errs:
		return nil, err
	case <-ctx.Done():
		return nil, fmt.Errorf("oob: waiting for a client canceled: %w", oob.ErrCanceled)
	case <-l.closed:
		return nil, fmt.Errorf("oob: accept failed: %w", net.ErrClosed)
	}
}

func (l *scriptedTCPListener) Addr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 3, 160), Port: 18515}
}

func (l *scriptedTCPListener) Close() error {
	select {
	case <-l.closed:
	default:
		close(l.closed)
	}
	return nil
}

// temporaryNetError is a net.Error that says it is temporary (as
// net/http's Serve asks), of no errno the loop knows.
type temporaryNetError struct{}

func (temporaryNetError) Error() string   { return "a temporary failure" }
func (temporaryNetError) Timeout() bool   { return false }
func (temporaryNetError) Temporary() bool { return true }

// acceptErr is err as pkg/oob returns an Accept's failure of the
// listener's: the net.OpError wrapped in a line of its own.
func acceptErr(errno error) error {
	op := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
	return fmt.Errorf("oob: accept on 127.0.3.160:18515 failed: %w", op)
}

// TestAcceptLoopRetriesOnlyTemporaryErrors: the TCP exchange's accept
// loop backs off and tries again after an Accept that failed for a while
// (out of descriptors or buffers, a connection aborted, a temporary
// net.Error, a timeout), and Run goes on serving; after one that will
// fail every time (EINVAL: the socket shut down under the daemon, EBADF,
// net.ErrClosed from a Close that was not the daemon's, an error that
// says nothing) the loop ends without waiting, logs it as an error, and
// Run shuts down and returns it. Bug (daemon timing task, item 1): the loop
// retried every error but ErrClosed, so a listener that could no longer
// accept logged a warning a second for ever while Run went on as if the
// exchange were up (and net.ErrClosed ended it silently, Run none the
// wiser).
func TestAcceptLoopRetriesOnlyTemporaryErrors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		temporary bool
	}{
		{"EMFILE", acceptErr(syscall.EMFILE), true},
		{"ENFILE", acceptErr(syscall.ENFILE), true},
		{"ENOBUFS", acceptErr(syscall.ENOBUFS), true},
		{"ENOMEM", acceptErr(syscall.ENOMEM), true},
		{"ECONNABORTED", acceptErr(syscall.ECONNABORTED), true},
		{"EPROTO", acceptErr(syscall.EPROTO), true},
		{"temporary net.Error", fmt.Errorf("oob: accept failed: %w", temporaryNetError{}), true},
		{"timeout", fmt.Errorf("oob: no client connected in time: %w", oob.ErrTimeout), true},
		{"EINVAL", acceptErr(syscall.EINVAL), false},
		{"EBADF", acceptErr(syscall.EBADF), false},
		{"closed by another", fmt.Errorf("oob: accept failed: %w", net.ErrClosed), false},
		{"unknown", errors.New("oob: accept failed: something else"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := newLogWatch()
			clock := newBackoffClock()
			d, err := New(Config{Addrs: addrs(t, "127.0.3.160"), IdleTimeout: -1, ShutdownGrace: -1, Ticker: clock.ticker,
				Logger: slog.New(logs), Exports: []ExportSpec{{Name: "data", Kind: ExportAnon, Size: 1 << 16}}})
			require.NoError(t, err)
			ln := newScriptedTCPListener()
			d.oobLn = ln
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			runErr := make(chan error, 1)
			go func() { runErr <- d.Run(ctx) }()
			ln.errs <- tc.err
			if tc.temporary {
				// Retried: a wait of the backoff, then Accept again.
				require.Equal(t, minAcceptBackoff, clock.nextDelay(t))
				clock.tick <- time.Now()
				ln.errs <- tc.err // taken: the loop is accepting again
				require.Equal(t, 2*minAcceptBackoff, clock.nextDelay(t))
				select {
				case <-d.acceptDone:
					t.Fatal("the accept loop ended on a temporary error")
				default:
				}
				cancel()
				require.NoError(t, <-runErr, "Run's error")
				return
			}
			// Run's context stays live: the loop's error alone ends Run.
			select {
			case err := <-runErr:
				require.ErrorIs(t, err, tc.err, "Run returns the accept loop's error")
			case delay := <-clock.delays:
				t.Fatalf("the accept loop backs off (%v) to retry a permanent error", delay)
			case <-time.After(10 * time.Second):
				cancel()
				t.Fatal("Run did not end on the accept loop's permanent error")
			}
			logs.mu.Lock()
			defer logs.mu.Unlock()
			require.True(t, slices.Contains(logs.msgs, "perftest exchange: accept failed for good: shutting down"), "logged: %q", logs.msgs)
		})
	}
}

// TestAcceptLoopFailureEndsTheCMBackoff: the TCP exchange's permanent
// failure shuts down a daemon whose rdma_cm loop is waiting out a
// backoff (its ticker never ticks here): Run's context ends with the
// failure, which ends that wait, and Run returns the error. Bug (found
// with TestAcceptLoopRetriesOnlyTemporaryErrors): shutdown waited for the
// rdma_cm loop, which waited for its backoff on a context nothing ended.
func TestAcceptLoopFailureEndsTheCMBackoff(t *testing.T) {
	clock := newBackoffClock()
	d, err := New(Config{Addrs: addrs(t, "127.0.3.162"), RDMACMPort: DefaultRDMACMPort, IdleTimeout: -1, ShutdownGrace: -1,
		Ticker: clock.ticker, Exports: []ExportSpec{{Name: "data", Kind: ExportAnon, Size: 1 << 16}}})
	require.NoError(t, err)
	ln := newScriptedTCPListener()
	d.oobLn = ln
	d.cm.ln = faultyCMListener{d.cm.ln, &acceptFaults{fail: func(int) bool { return true }}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()
	require.Equal(t, minAcceptBackoff, clock.nextDelay(t), "the rdma_cm loop backs off")
	einval := acceptErr(syscall.EINVAL)
	ln.errs <- einval
	select {
	case err := <-runErr:
		require.ErrorIs(t, err, einval)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("Run did not end: its shutdown waits for the rdma_cm loop's backoff")
	}
	require.Equal(t, int32(1), clock.stops.Load(), "the backoff's ticker stopped")
}

// TestServeFailedKeepsTheFirstFailure: both accept loops may fail for
// good at once (the device closed under the rdma_cm one while the TCP
// listener shut down); the first failure is Run's error and the second
// neither replaces it nor closes acceptFailed again (a panic). Bug
// reference: rdma_cm listener edges task, item 2, which made the rdma_cm
// loop a second caller.
func TestServeFailedKeepsTheFirstFailure(t *testing.T) {
	d := &Daemon{acceptFailed: make(chan struct{})}
	first, second := errors.New("first"), errors.New("second")
	d.serveFailed(first)
	require.NotPanics(t, func() { d.serveFailed(second) })
	<-d.acceptFailed
	require.Same(t, first, d.acceptErr)
}
