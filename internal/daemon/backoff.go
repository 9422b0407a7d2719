package daemon

import (
	"context"
	"net"
	"net/netip"
	"time"

	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/rdmacm"
)

// The accept loops' backoff. An Accept that fails (EMFILE or ENFILE:
// out of file descriptors; ENOBUFS) will likely fail again at once, so
// the loop waits before it tries again, as net/http's Server.Serve does
// on a temporary error: 5 ms, doubling up to 1 s, and from 5 ms again
// once an Accept succeeds. The wait ends early with Run's context, so
// that Close (or SIGTERM) does not wait out the delay, and it waits on
// Config.Ticker when one is set (its first tick), so that a test drives
// it instead of the wall clock. It was a time.Sleep(50 ms), which held
// shutdown up to its length and which no test could drive. The TCP loop
// backs off only after a temporary failure; any other ends it, and Run
// (accept_errors.go).

const (
	minAcceptBackoff = 5 * time.Millisecond
	maxAcceptBackoff = time.Second
)

// acceptBackoff is one accept loop's current delay (0: the last Accept
// succeeded).
type acceptBackoff struct{ delay time.Duration }

// next is the delay to wait after one more failure.
func (b *acceptBackoff) next() time.Duration {
	b.delay = min(max(2*b.delay, minAcceptBackoff), maxAcceptBackoff)
	return b.delay
}

// reset starts over after a success.
func (b *acceptBackoff) reset() { b.delay = 0 }

// wait waits delay (Config.Ticker's first tick, or a timer), and reports
// false if ctx ended first.
func (d *Daemon) wait(ctx context.Context, delay time.Duration) bool {
	tick, stop := d.ticker(delay)
	defer stop()
	select {
	case <-tick:
		return true
	case <-ctx.Done():
		return false
	}
}

// tcpListener is what the TCP accept loop uses of its listener
// (*oob.PerftestListener), and cmListener what the rdma_cm one uses
// (*rdmacm.Listener): interfaces so that a test can make Accept fail.
type tcpListener interface {
	Accept(ctx context.Context) (*oob.Session, error)
	Addr() net.Addr
	Close() error
}

type cmListener interface {
	Accept(ctx context.Context) (*rdmacm.Request, error)
	Addr() netip.AddrPort
	Close() error
}
