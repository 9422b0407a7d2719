package allreduce

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/rxed/rxed/pkg/oob"
)

// tcpLink sends each step's chunk as step u32 | length u32 | bytes on a
// stream to the next rank; the send runs in its own goroutine (the
// writer) so two neighbours writing large chunks at each other cannot
// deadlock.
type tcpLink struct {
	cfg  Config
	next net.Conn
	prev net.Conn
	r    *bufio.Reader
	buf  []byte
	// sent receives the result of the last send's writer, until waitSent
	// took it (nil then). One channel per writer, with room for its one
	// result: a writer whose waitSent gave up (its context ended) never
	// blocks on its result, so close's wait for the writers cannot hang.
	sent chan error
	// writers are the sends' goroutines, which close joins: a writer a
	// failed step left behind (waitSent gave up on it) ends only once
	// close has closed its stream or its deadline passed.
	writers sync.WaitGroup
}

// newTCPLink is a rank's link before its streams are connected.
func newTCPLink(cfg Config) *tcpLink {
	return &tcpLink{cfg: cfg, buf: make([]byte, maxChunk(cfg.Count, cfg.Ranks)*4)}
}

// TCPConfig says where a rank listens and where its next rank is.
type TCPConfig struct {
	Listen string // our TCP address
	Next   string // the next rank's
}

// DialTCP joins the ring over TCP, with the same checks as DialRDMA.
func DialTCP(ctx context.Context, cfg Config, tc TCPConfig) (*Ring, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", tc.Listen)
	if err != nil {
		return nil, fmt.Errorf("allreduce: rank %d listening on %s: %w", cfg.Rank, tc.Listen, err)
	}
	l := newTCPLink(cfg)
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	accepted := make(chan error, 1)
	go func() {
		err := l.acceptPrev(ctx, ln)
		if errors.Is(err, errMismatch) {
			cancel()
		}
		accepted <- err
	}()
	dialErr := l.dialNext(ctx, tc.Next)
	if dialErr != nil {
		cancel()
	}
	accErr := <-accepted // acceptPrev closed ln
	if err := firstCause(dialErr, accErr); err != nil {
		l.close()
		return nil, err
	}
	r := &Ring{ring: ring{cfg: cfg, l: l, data: make([]float32, cfg.Count)}}
	r.closeFn = l.close
	// A neighbour leaving shows as an error on the stream itself.
	r.done, r.doneE = make(chan struct{}), func() error { return nil }
	return r, nil
}

// acceptPrev takes the previous rank's connection: the first whose hello
// is a ring's. Each connection's hello is read on its own, so one that is
// not a ring's (a port scanner, a health check, an HTTP client at the
// wrong port) is closed and passed over, and one that says nothing does
// not hold the neighbour's back, as the RDMA ring passes over a REQ that
// is not a ring's. On return ln and the connections not taken are closed,
// and the goroutines that accepted and read them have ended.
func (l *tcpLink) acceptPrev(ctx context.Context, ln net.Listener) error {
	type arrival struct {
		c   net.Conn
		h   hello
		err error // reading or parsing the hello; the listener's end if c is nil
	}
	arrivals := make(chan arrival)
	quit := make(chan struct{})
	var mu sync.Mutex
	var open []net.Conn // closed on return, but for the one taken
	var taken net.Conn
	returned := false
	var acceptors sync.WaitGroup // the accept loop and each connection's hello reader
	defer func() {
		close(quit)
		_ = ln.Close() // ends the accept loop
		mu.Lock()
		returned = true
		for _, c := range open {
			if c != taken {
				c.Close() // ends its hello reader
			}
		}
		mu.Unlock()
		hook(acceptorsJoined)
		acceptors.Wait()
	}()
	deliver := func(a arrival) {
		select {
		case arrivals <- a:
		case <-quit:
			if a.c != nil {
				a.c.Close()
			}
		}
	}
	dl, _ := ctx.Deadline()
	acceptors.Add(1)
	go func() {
		defer acceptors.Done()
		defer hook(acceptorsExit)
		for {
			c, err := ln.Accept()
			if err != nil {
				deliver(arrival{err: err})
				return
			}
			mu.Lock()
			if returned {
				mu.Unlock()
				c.Close()
				return
			}
			open = append(open, c)
			acceptors.Add(1) // the loop's own count is held: Wait cannot have returned
			mu.Unlock()
			go func() {
				defer acceptors.Done()
				defer hook(acceptorsExit)
				_ = c.SetDeadline(dl)
				var b [helloLen]byte
				if _, err := io.ReadFull(c, b[:]); err != nil {
					deliver(arrival{c: c, err: err})
					return
				}
				h, err := parseHello(b[:])
				deliver(arrival{c: c, h: h, err: err})
			}()
		}
	}()
	for {
		var a arrival
		select {
		case a = <-arrivals:
		case <-ctx.Done():
			return fmt.Errorf("allreduce: rank %d: no connection from rank %d within %v", l.cfg.Rank, l.cfg.prev(), l.cfg.Timeout)
		}
		if a.c == nil {
			return fmt.Errorf("allreduce: rank %d: no connection from rank %d within %v", l.cfg.Rank, l.cfg.prev(), l.cfg.Timeout)
		}
		if a.err != nil {
			a.c.Close() // not a ring's hello: not our neighbour
			continue
		}
		c := a.c
		err := l.cfg.agree(a.h, l.cfg.prev())
		answer := hello{rank: l.cfg.Rank, ranks: l.cfg.Ranks, count: l.cfg.Count}.append(nil)
		var reason string
		if err != nil {
			reason = err.Error()
		}
		answer = binary.LittleEndian.AppendUint16(answer, uint16(len(reason)))
		answer = append(answer, reason...)
		_, _ = c.Write(answer)
		if err != nil {
			return fmt.Errorf("allreduce: %w", err)
		}
		_ = c.SetDeadline(time.Time{})
		mu.Lock()
		taken = c
		mu.Unlock()
		l.prev, l.r = c, bufio.NewReaderSize(c, 64<<10)
		return nil
	}
}

func (l *tcpLink) dialNext(ctx context.Context, addr string) error {
	var d net.Dialer
	retry := l.cfg.joinRetry()
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("allreduce: rank %d: could not connect to rank %d at %s within %v: %v", l.cfg.Rank, l.cfg.next(), addr, l.cfg.Timeout, err)
			}
			retry.wait(ctx) // not listening yet (backoff.go)
			continue
		}
		dl, _ := ctx.Deadline()
		_ = c.SetDeadline(dl)
		// A cancelled ctx ends the hello exchange too, not only its
		// deadline (a next rank that accepted and never answers).
		done := oob.InterruptOn(ctx, c.SetDeadline)
		helloErr := func(what string, err error) error {
			done()
			c.Close()
			if ctx.Err() != nil {
				err = context.Cause(ctx)
			}
			return fmt.Errorf("allreduce: rank %d: %s rank %d: %w", l.cfg.Rank, what, l.cfg.next(), err)
		}
		if _, err := c.Write(hello{rank: l.cfg.Rank, ranks: l.cfg.Ranks, count: l.cfg.Count}.append(nil)); err != nil {
			return helloErr("hello to", err)
		}
		var b [helloLen + 2]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return helloErr("no answer from", err)
		}
		if done(); ctx.Err() != nil {
			return helloErr("no answer from", context.Cause(ctx))
		}
		if n := binary.LittleEndian.Uint16(b[helloLen:]); n > 0 {
			reason := make([]byte, n)
			_, _ = io.ReadFull(c, reason)
			c.Close()
			return fmt.Errorf("allreduce: rank %d refused rank %d: %w", l.cfg.next(), l.cfg.Rank, &mismatchError{string(reason)})
		}
		h, err := parseHello(b[:])
		if err == nil {
			err = l.cfg.agree(h, l.cfg.next())
		}
		if err != nil {
			c.Close()
			return fmt.Errorf("allreduce: %w", err)
		}
		_ = c.SetDeadline(time.Time{})
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		l.next = c
		return nil
	}
}

func (l *tcpLink) send(ctx context.Context, step uint32, b []byte, _ bool) error {
	if err := l.waitSent(ctx); err != nil { // one write at a time on the stream
		return err
	}
	sent := make(chan error, 1)
	l.sent = sent
	dl, _ := ctx.Deadline()
	_ = l.next.SetWriteDeadline(dl)
	l.writers.Add(1)
	go func() {
		defer l.writers.Done()
		defer hook(writerExits)
		var h [8]byte
		binary.LittleEndian.PutUint32(h[:], step)
		binary.LittleEndian.PutUint32(h[4:], uint32(len(b)))
		_, err := (&net.Buffers{h[:], b}).WriteTo(l.next)
		if err != nil {
			err = fmt.Errorf("sending to rank %d: %w", l.cfg.next(), err)
		}
		sent <- err
	}()
	return nil
}

func (l *tcpLink) recv(ctx context.Context, step uint32, n int) (b []byte, err error) {
	dl, _ := ctx.Deadline()
	_ = l.prev.SetReadDeadline(dl)
	// A cancelled ctx ends the read as its deadline does (the RDMA ring's
	// wait takes both), and says so rather than blame the previous rank.
	done := oob.InterruptOn(ctx, l.prev.SetReadDeadline)
	defer func() {
		if done(); err != nil && ctx.Err() != nil {
			err = context.Cause(ctx)
		}
	}()
	var h [8]byte
	if _, err := io.ReadFull(l.r, h[:]); err != nil {
		return nil, l.recvErr(err)
	}
	if s, m := binary.LittleEndian.Uint32(h[:]), int(binary.LittleEndian.Uint32(h[4:])); s != step || m != n {
		return nil, fmt.Errorf("rank %d (%v) sent step %d (%d bytes) while expecting step %d (%d bytes)", l.cfg.prev(), l.prev.RemoteAddr(), s, m, step, n)
	}
	if _, err := io.ReadFull(l.r, l.buf[:n]); err != nil {
		return nil, l.recvErr(err)
	}
	return l.buf[:n], nil
}

func (l *tcpLink) recvErr(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("no data from rank %d within %v (did it die?)", l.cfg.prev(), l.cfg.Timeout)
	}
	return fmt.Errorf("rank %d left the ring (%v)", l.cfg.prev(), err)
}

func (l *tcpLink) waitSent(ctx context.Context) error {
	sent := l.sent
	if sent == nil {
		return nil
	}
	l.sent = nil
	select {
	case err := <-sent:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// leave has nothing to wait for: a rank that finished has read every byte
// its previous rank sends it and written everything to its next, which
// the kernel delivers before the FIN, so closing cannot cut a neighbour's
// step short (unlike an RDMA disconnect, which flushes the QP).
func (l *tcpLink) leave(context.Context) error { return nil }

// hangUp closes the streams: that is all a TCP neighbour needs to learn
// it, and it waits for nothing.
func (l *tcpLink) hangUp() { _ = l.close() }

// close closes both streams and returns once the writers have ended
// (closing the stream ends a blocked write).
func (l *tcpLink) close() error {
	for _, c := range []net.Conn{l.next, l.prev} {
		if c != nil {
			c.Close()
		}
	}
	hook(writersJoined)
	l.writers.Wait()
	return nil
}
