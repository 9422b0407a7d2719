package oob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultTimeout bounds each step of an exchange when Options.Timeout is
// zero. The tools themselves wait forever; a peer that goes silent for this
// long is treated as gone.
const DefaultTimeout = 30 * time.Second

// DefaultPort is the TCP port ibv_*_pingpong and perftest use (-p).
const DefaultPort = 18515

// Options tune an exchange. The zero value is ready to use.
type Options struct {
	// Timeout bounds every step (dial, each message read or write). Zero
	// means DefaultTimeout; negative means no per-step bound (the context
	// still applies).
	Timeout time.Duration
	// Logger receives a debug record per message; nil is silent.
	Logger *slog.Logger
	// KeepAlive is how long the TCP connection may carry nothing before
	// the kernel probes the peer (TCP keepalive, then a probe a second):
	// after KeepAliveProbes unanswered probes the connection fails and
	// the waiting step with it, ErrClosed saying the peer stopped
	// answering. It bounds the waits Timeout does not (an idle server's
	// read through its client's run, keepalive.go): a peer whose host
	// vanished ends them within KeepAlive plus KeepAliveProbes seconds.
	// Zero means Timeout (DefaultTimeout when that is not positive);
	// negative leaves the connection's keepalive as Go set it (15 s, then
	// 9 probes 15 s apart).
	KeepAlive time.Duration
	// KeepAliveProbes is how many unanswered probes end the connection;
	// zero means DefaultKeepAliveProbes (5).
	KeepAliveProbes int
}

func (o *Options) timeout() time.Duration {
	if o == nil || o.Timeout == 0 {
		return DefaultTimeout
	}
	return o.Timeout
}

func (o *Options) logger() *slog.Logger {
	if o == nil || o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Logger
}

// stream wraps one TCP connection with per-step deadlines, context
// cancellation and errors that name the peer and the step.
type stream struct {
	c         net.Conn
	peer      string
	timeout   time.Duration
	log       *slog.Logger
	closeOnce sync.Once
	closeErr  error
	bytesIn   atomic.Int64 // bytes read from the peer
	// keepAlive is how long a silent peer can hold a step (setKeepAlive;
	// 0: not ours to say), for the error that ends one.
	keepAlive time.Duration
}

func newStream(c net.Conn, o *Options) *stream {
	return &stream{c: c, peer: c.RemoteAddr().String(), timeout: o.timeout(), log: o.logger(),
		keepAlive: setKeepAlive(c, o)}
}

// step arms the deadline for one step and makes ctx cancellation interrupt
// blocked I/O. bounded=false leaves only the context in charge (for waits
// that legitimately span a whole test run).
func (s *stream) step(ctx context.Context, bounded bool) (done func()) {
	var dl time.Time
	if bounded && s.timeout > 0 {
		dl = time.Now().Add(s.timeout)
	}
	if d, ok := ctx.Deadline(); ok && (dl.IsZero() || d.Before(dl)) {
		dl = d
	}
	_ = s.c.SetDeadline(dl)
	return InterruptOn(ctx, s.c.SetDeadline)
}

// InterruptOn makes ctx's cancellation set a deadline in the past through
// setDeadline (a net.Conn's or net.Listener's), which ends the blocked
// I/O, until the returned function is called; a cancellation racing with
// that call cannot leak into a later step. A caller that got an error
// and finds ctx done after done() may report ctx's cause instead.
func InterruptOn(ctx context.Context, setDeadline func(time.Time) error) (done func()) {
	var mu sync.Mutex
	finished := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			_ = setDeadline(time.Unix(1, 0))
		}
	})
	return func() {
		stop()
		mu.Lock()
		finished = true
		mu.Unlock()
	}
}

// readMsg reads exactly len(buf) bytes of the step named what.
func (s *stream) readMsg(ctx context.Context, buf []byte, what string, bounded bool) error {
	done := s.step(ctx, bounded)
	defer done()
	n, err := io.ReadFull(s.c, buf)
	s.bytesIn.Add(int64(n))
	if err != nil {
		return s.ioError(ctx, err, n, len(buf), what, "read")
	}
	s.log.Debug("oob recv", "peer", s.peer, "what", what, "len", n)
	return nil
}

// writeMsg writes buf in one write call, as the C tools do.
func (s *stream) writeMsg(ctx context.Context, buf []byte, what string) error {
	done := s.step(ctx, true)
	defer done()
	n, err := s.c.Write(buf)
	if err != nil {
		return s.ioError(ctx, err, n, len(buf), what, "write")
	}
	s.log.Debug("oob send", "peer", s.peer, "what", what, "len", n)
	return nil
}

func (s *stream) ioError(ctx context.Context, err error, n, want int, what, op string) error {
	e := s.classify(ctx, err, n, want, what, op)
	e.(*stepError).got = n
	return e
}

func (s *stream) classify(ctx context.Context, err error, n, want int, what, op string) error {
	switch {
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		return errorf(s.peer, ErrCanceled, "%s: %s of %s canceled after %d of %d bytes", what, op, what, n, want)
	case errors.Is(err, os.ErrDeadlineExceeded):
		if op == "read" {
			return errorf(s.peer, ErrTimeout, "sent no complete %s in time (got %d of %d bytes)", what, n, want)
		}
		return errorf(s.peer, ErrTimeout, "did not accept the %s in time (wrote %d of %d bytes)", what, n, want)
	case errors.Is(err, syscall.ETIMEDOUT):
		// The kernel gave the connection up: keepalive probes or data
		// unacknowledged for keepAlive (setKeepAlive). A process that
		// died on a live host closes its end itself; this is a host gone
		// or cut off.
		gone := "its host is gone or cut off"
		if s.keepAlive > 0 {
			gone = fmt.Sprintf("nothing from it for %v, TCP keepalive probes unanswered: %s", s.keepAlive, gone)
		}
		if op == "read" {
			return errorf(s.peer, ErrClosed, "stopped answering while we waited for the %s (got %d of %d bytes): %s", what, n, want, gone)
		}
		return errorf(s.peer, ErrClosed, "stopped answering while we wrote the %s: %s", what, gone)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed):
		if op == "read" {
			return errorf(s.peer, ErrClosed, "sent %d bytes, want %d (%s): connection closed", n, want, what)
		}
		return errorf(s.peer, ErrClosed, "closed the connection while we wrote the %s", what)
	default:
		return errorf(s.peer, err, "%s of %s failed: %v", op, what, err)
	}
}

// close closes the connection once; later calls return the first result.
func (s *stream) close() error {
	s.closeOnce.Do(func() { s.closeErr = s.c.Close() })
	return s.closeErr
}

// dial connects to address within the step timeout and ctx.
func dial(ctx context.Context, address string, o *Options) (*stream, error) {
	d := net.Dialer{}
	if t := o.timeout(); t > 0 {
		d.Timeout = t
	}
	c, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		switch {
		case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
			return nil, errorf("", ErrCanceled, "connecting to %s canceled", address)
		case isTimeout(err):
			return nil, errorf("", ErrTimeout, "couldn't connect to %s: timed out", address)
		}
		return nil, errorf("", err, "couldn't connect to %s: %v", address, unwrapOp(err))
	}
	return newStream(c, o), nil
}

// accept waits for one connection; only ctx bounds the wait, as the tools
// wait for their client indefinitely.
func accept(ctx context.Context, ln net.Listener, o *Options) (*stream, error) {
	type deadliner interface{ SetDeadline(time.Time) error }
	if dl, ok := ln.(deadliner); ok {
		d, _ := ctx.Deadline()
		_ = dl.SetDeadline(d)
		done := InterruptOn(ctx, dl.SetDeadline)
		defer func() {
			done()
			_ = dl.SetDeadline(time.Time{})
		}()
	}
	c, err := ln.Accept()
	if err != nil {
		switch {
		case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
			return nil, errorf("", ErrCanceled, "waiting for a client on %s canceled", ln.Addr())
		case isTimeout(err):
			return nil, errorf("", ErrTimeout, "no client connected to %s in time", ln.Addr())
		}
		return nil, errorf("", err, "accept on %s failed: %v", ln.Addr(), unwrapOp(err))
	}
	return newStream(c, o), nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// unwrapOp strips net.OpError's repetition of addresses for a short line.
func unwrapOp(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err
	}
	return err
}

// listen opens the TCP listener like the tools' getaddrinfo(AI_PASSIVE)
// loop: address ":18515" listens on every address.
func listen(address string) (net.Listener, error) {
	ln, err := net.Listen("tcp", address)
	if err != nil {
		return nil, errorf("", err, "couldn't listen on %s: %v", address, unwrapOp(err))
	}
	return ln, nil
}
