package kv

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxed/rxed/pkg/oob"
)

// TCPServer serves an App's table over TCP: the request/response design
// a Go developer would write instead, one goroutine per connection, GETs
// read under the table's lock.
//
// mu guards conns and closed.
type TCPServer struct {
	app *App
	ln  net.Listener
	wg  sync.WaitGroup
	// maxConns bounds conns (TCPServerConfig.MaxConns); refused counts
	// the connections closed as accepted beyond it.
	maxConns int
	refused  atomic.Uint64
	// lingerSlots holds one token per refused connection lingering
	// (lingeringClose), at most maxLingering; lingerTime bounds each.
	lingerSlots chan struct{}
	lingerTime  time.Duration

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// TCPServerConfig configures ServeTCPWith. Zero values take the defaults.
type TCPServerConfig struct {
	// MaxConns bounds the connections served at once, those lingering
	// after a refused request included. One beyond them is answered with
	// one busy response and closed as it is accepted, before anything is
	// read from it or allocated for it (busy.go), so its client's first
	// call fails with ErrServerBusy (the RDMA server's REJ says "kv: too
	// many clients", which its client reports the same way). 0:
	// DefaultMaxConns, as over RDMA.
	MaxConns int
}

// ServeTCP serves a's table on ln until Close, with the default
// TCPServerConfig.
func ServeTCP(a *App, ln net.Listener) *TCPServer {
	return serveTCP(a, ln, DefaultMaxConns, lingerTime)
}

// ServeTCPWith is ServeTCP with cfg (nil: the defaults).
func ServeTCPWith(a *App, ln net.Listener, cfg *TCPServerConfig) (*TCPServer, error) {
	if cfg == nil {
		cfg = &TCPServerConfig{}
	}
	maxConns := cfg.MaxConns
	switch {
	case maxConns < 0:
		return nil, fmt.Errorf("kv: MaxConns %d: want 0 (the default, %d) or more", maxConns, DefaultMaxConns)
	case maxConns == 0:
		maxConns = DefaultMaxConns
	}
	return serveTCP(a, ln, maxConns, lingerTime), nil
}

// serveTCP serves at most maxConns connections at once, each refused
// connection's linger bounded by linger (tests: longer than the test).
func serveTCP(a *App, ln net.Listener, maxConns int, linger time.Duration) *TCPServer {
	s := &TCPServer{app: a, ln: ln, conns: map[net.Conn]struct{}{}, maxConns: maxConns,
		lingerSlots: make(chan struct{}, maxLingering), lingerTime: linger}
	s.wg.Add(1)
	go s.acceptLoop()
	return s
}

// Addr is the listener's address.
func (s *TCPServer) Addr() net.Addr { return s.ln.Addr() }

func (s *TCPServer) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		if len(s.conns) >= s.maxConns {
			// Over the cap: answered busy and closed before it costs a
			// goroutine or a buffer (a flood of connections costs the
			// accept loop only). Bug (workload review, task BF): there
			// was no cap (TestTCPServerCapsConnections). Bug (workload
			// edges, task N): it was closed without a word, and its
			// client saw ErrConnLost, as from a crash
			// (TestTCPClientSeesServerBusy).
			s.mu.Unlock()
			s.refused.Add(1)
			refuseBusy(c)
			continue
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

// serve handles one connection. When the handlers' CPU is measured the
// goroutine is locked to its thread, so the thread's CPU time (read,
// handle, write) is the application's work for this connection
// (App.MeasureHandlerCPU).
func (s *TCPServer) serve(c net.Conn) {
	defer s.wg.Done()
	defer s.app.handlerThread()()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	b := newConnBuffers(c, reqHdrLen+MaxKey+s.app.table.Config().ExtentSize)
	t0 := s.app.handlerCPU()
	for {
		if err := b.readHeader(); err != nil {
			return
		}
		hdr := b.hdr[:]
		n := reqBodyLen(hdr)
		var err error
		if reqHdrLen+n > b.maxMsg {
			// Longer than any request of this table: refused with the
			// reason, as the RDMA client refuses it before sending. A
			// body the server can read past cheaply is discarded, so
			// the connection goes on; a longer claim (up to 4 GiB) ends
			// it after the answer, lingering so that the answer is not
			// lost to a reset (lingeringClose). Nothing is allocated for
			// either's body.
			s.app.tcp.bad.Add(1)
			b.out = appendResponse(b.out[:0], oversizeStatus(hdr), binary.LittleEndian.Uint32(hdr[8:]), nil)
			if n > maxDiscard {
				if _, err := c.Write(b.out); err == nil {
					s.lingeringClose(c, b.r, int64(n))
				}
				return
			}
			if _, err := io.CopyN(io.Discard, b.r, int64(n)); err != nil {
				return
			}
		} else {
			msg := b.message(reqHdrLen + n)
			if _, err := io.ReadFull(b.r, msg[reqHdrLen:]); err != nil {
				return
			}
			b.out = s.app.handle(&s.app.tcp, msg, b.out[:0])
		}
		_, err = c.Write(b.out)
		t1 := s.app.handlerCPU()
		s.app.tcp.cpuNanos.Add(t1 - t0)
		t0 = t1
		if err != nil {
			return
		}
	}
}

// maxDiscard is the longest oversized request body the TCP server reads
// past to keep the connection (a value up to MaxExtent: a client of a
// table with smaller extents).
const maxDiscard = reqHdrLen + MaxKey + MaxExtent

// oversizeStatus is the refusal of a request header whose body is longer
// than the table's largest request: the key's fault if it is too long,
// else the value's.
func oversizeStatus(h []byte) status {
	if int(h[1]) > MaxKey {
		return statusBadKey
	}
	return statusBadValue
}

// Refused is how many connections the server answered busy and closed as
// it accepted them, over TCPServerConfig.MaxConns.
func (s *TCPServer) Refused() uint64 { return s.refused.Load() }

// Close stops the server and closes every connection.
func (s *TCPServer) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

// TCPClient is one TCP connection to a kv server. Not safe for
// concurrent use.
type TCPClient struct {
	addr  string
	c     net.Conn
	r     *bufio.Reader
	out   []byte
	id    uint32
	stats ClientStats
	// closed: c is closed, by Close or by a call its context ended
	// (Reconnect opens another); Close then has nothing to do.
	closed bool
}

// DialTCP connects to the kv server's TCP address.
func DialTCP(ctx context.Context, addr string) (*TCPClient, error) {
	cl := &TCPClient{addr: addr}
	if err := cl.Reconnect(ctx); err != nil {
		return nil, err
	}
	return cl, nil
}

// Reconnect dials the server again.
func (cl *TCPClient) Reconnect(ctx context.Context) error {
	if cl.c != nil && !cl.closed {
		cl.c.Close()
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", cl.addr)
	if err != nil {
		return fmt.Errorf("kv: connecting to %s: %w", cl.addr, err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	cl.c, cl.r, cl.closed = c, bufio.NewReaderSize(c, 4096), false
	return nil
}

// Close closes the connection. It returns nil when the connection is
// already closed (a call whose context ended dropped it, or an earlier
// Close), as the RDMA client's Close does.
func (cl *TCPClient) Close() error {
	if cl.closed {
		return nil
	}
	cl.closed = true
	return cl.c.Close()
}

// Stats returns the client's counters (BytesRead: response bytes).
func (cl *TCPClient) Stats() ClientStats { return cl.stats }

func (cl *TCPClient) lost(err error) error {
	return fmt.Errorf("kv: connection to %s lost (server closed, restarted or unreachable): %w; reconnect to go on",
		cl.addr, errors.Join(ErrConnLost, err))
}

// call sends one request and reads its response; val receives the value.
func (cl *TCPClient) call(ctx context.Context, o op, key, val []byte) (v []byte, err error) {
	cl.id++
	cl.out = appendRequest(cl.out[:0], o, cl.id, key, val)
	if dl, ok := ctx.Deadline(); ok {
		_ = cl.c.SetDeadline(dl)
	} else {
		_ = cl.c.SetDeadline(time.Time{})
	}
	// A cancelled ctx ends the call too, not only its deadline: the
	// socket's deadline moves to the past, which ends a blocked read or
	// write. The stream is then out of step (a response may still come),
	// so the connection is dropped, as the RDMA client drops a QP with
	// work outstanding: the error wraps ErrConnLost and ctx's cause. (The
	// next call sets its own deadline.)
	done := oob.InterruptOn(ctx, cl.c.SetDeadline)
	defer func() {
		done()
		if err != nil && ctx.Err() != nil {
			_ = cl.c.Close()
			cl.closed = true
			err = cl.lost(context.Cause(ctx))
		}
	}()
	if _, err := cl.c.Write(cl.out); err != nil {
		return nil, cl.lost(err)
	}
	var h [respHdrLen]byte
	if _, err := io.ReadFull(cl.r, h[:]); err != nil {
		return nil, cl.lost(err)
	}
	r, _ := parseResponseHdr(h[:])
	if r.status == statusBusy && r.valLen == 0 {
		// The server's only message on a connection over its cap,
		// whatever request it answers (it read none): the connection
		// is closed.
		_ = cl.c.Close()
		cl.closed = true
		return nil, busyError(cl.addr)
	}
	if r.id != cl.id {
		return nil, cl.lost(fmt.Errorf("response to request %d while waiting for %d", r.id, cl.id))
	}
	if r.valLen > 0 {
		v = make([]byte, r.valLen)
		if _, err := io.ReadFull(cl.r, v); err != nil {
			return nil, cl.lost(err)
		}
		cl.stats.BytesCopiedOut += uint64(r.valLen)
	}
	cl.stats.BytesRead += uint64(respHdrLen + r.valLen)
	return v, r.status.err()
}

// Get returns key's value.
func (cl *TCPClient) Get(ctx context.Context, key []byte) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	cl.stats.Gets++
	v, err := cl.call(ctx, opGet, key, nil)
	if err == nil && v == nil {
		v = []byte{}
	}
	return v, err
}

// Put stores val under key.
func (cl *TCPClient) Put(ctx context.Context, key, val []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	cl.stats.Puts++
	_, err := cl.call(ctx, opPut, key, val)
	return err
}

// Delete removes key.
func (cl *TCPClient) Delete(ctx context.Context, key []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	cl.stats.Deletes++
	_, err := cl.call(ctx, opDelete, key, nil)
	return err
}

// ServerStats asks the server for its application's counters (RDMA and
// TCP handlers): how a benchmark in another process learns them.
func (cl *TCPClient) ServerStats(ctx context.Context) (rdma, tcp HandlerStats, err error) {
	v, err := cl.call(ctx, opStats, []byte("stats"), nil)
	if err != nil {
		return rdma, tcp, err
	}
	rdma, tcp, ok := decodeStats(v)
	if !ok {
		return rdma, tcp, errors.New("kv: malformed stats from the server")
	}
	return rdma, tcp, nil
}

// Client is what both transports' clients do.
type Client interface {
	Get(ctx context.Context, key []byte) ([]byte, error)
	Put(ctx context.Context, key, val []byte) error
	Delete(ctx context.Context, key []byte) error
	Reconnect(ctx context.Context) error
	Stats() ClientStats
	Close() error
}

var (
	_ Client = (*RDMAClient)(nil)
	_ Client = (*TCPClient)(nil)
)
