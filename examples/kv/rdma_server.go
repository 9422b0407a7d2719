package kv

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
)

// RDMAServer serves an App's table over RDMA: the table is registered for
// remote READ only (clients cannot write it), each client connects with
// rdma_cm and gets its own RC QP, and one handler goroutine applies the
// PUTs and DELETEs that arrive by SEND. A keepalive goroutine probes
// idle connections (RDMAServerConfig.KeepAlive) so that a client that
// vanished without disconnecting does not keep its slot.
//
// mu guards conns and closed; the accept loop, the per-connection
// watchers, the handler, the keepalive goroutine and Close meet there.
// An entry of conns is a slot, and its QP and region are the server's:
// whoever takes an entry out (a watcher, kill, a failed accept, Close)
// frees them. The handler owns the receive buffers.
type RDMAServer struct {
	app       *App
	dev       *ib.Device
	log       *slog.Logger
	l         *rdmacm.Listener
	pd        *ib.PD
	tableMR   *ib.MR
	recvCQ    *ib.CQ
	sendCQ    *ib.CQ
	hello     hello
	maxConns  int
	ackTO     uint8
	keepAlive time.Duration // <= 0: no probes
	hook      func(point string)
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup

	probesAcked atomic.Uint64 // keepalives the clients' QPs acknowledged

	mu     sync.Mutex
	conns  map[uint32]*serverConn // by QPN
	closed bool
}

// serverConn is one client's QP and its receive buffers.
type serverConn struct {
	qp   *ib.QP
	conn *rdmacm.Conn
	mr   *ib.MR
	buf  []byte // recvDepth slots of maxMsg bytes

	// active: a request arrived since the keepalive goroutine last
	// looked (the handler sets it, that goroutine clears it). probing: a
	// keepalive is outstanding (set when posted, cleared by its
	// completion).
	active, probing atomic.Bool
}

const (
	recvDepth      = 4 // a client has one request outstanding; a few spare
	responderDepth = 16
	// keepaliveID is the work request ID of a keepalive WRITE (a
	// response SEND's is 0).
	keepaliveID = 1 << 63
)

// Defaults of RDMAServerConfig.
const (
	// DefaultKeepAlive is the idle time before a connection is probed:
	// Go's TCP keepalive idle time (net.ListenConfig), so the server's
	// RDMA and TCP sides notice a vanished client alike. rsockets'
	// default, TCP's tcp_keepalive_time, is 2 hours, long for a server
	// whose connection slots are few.
	DefaultKeepAlive = 15 * time.Second
	// DefaultMaxConns bounds the connected clients.
	DefaultMaxConns = 256
	// DefaultServerACKTimeout is the local ACK timeout exponent of the
	// server's QPs (67 ms, the client's too): with the client's 7
	// retries, a client that stopped answering fails a probe or a
	// response in about half a second. rdma_cm would take the REQ's
	// (2.1 s on RoCE: 17 s).
	DefaultServerACKTimeout = 14
)

// RDMAServerConfig configures ServeRDMA. Zero values take the defaults.
type RDMAServerConfig struct {
	Logger *slog.Logger // nil: silent
	// KeepAlive is how long a connection may stay idle (no request
	// received) before the server probes it with a zero-length RDMA
	// WRITE, as rsockets' keepalive does. The probe costs the client's
	// engine an ACK and its application nothing; a client that vanished
	// without disconnecting (its process or host died) leaves it
	// unanswered, its QP runs out of retries, and the server frees the
	// connection, as it frees any connection one of whose completions
	// fails. A dead idle client is thus freed within about twice
	// KeepAlive. 0: DefaultKeepAlive; negative: no probes.
	KeepAlive time.Duration
	// MaxConns bounds the connected clients; more are refused (REJ 28
	// with "kv: too many clients", busyRejectReason, which DialRDMA
	// reports as ErrServerBusy). 0: DefaultMaxConns.
	MaxConns int
	// ACKTimeout is the local ACK timeout exponent of the clients' QPs
	// on the server (4.096 us * 2^N), 1..31. 0: DefaultServerACKTimeout.
	ACKTimeout uint8

	// hook, if set (tests), is called at the named points of an accept
	// and of Close, to hold one side of their race where a test wants it.
	hook func(point string)
}

// ServeRDMA registers a's table on dev and listens for rdma_cm connections
// on addr. The device stays the caller's; Close the server before it.
func ServeRDMA(a *App, dev *ib.Device, addr netip.AddrPort, cfg *RDMAServerConfig) (*RDMAServer, error) {
	if cfg == nil {
		cfg = &RDMAServerConfig{}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &RDMAServer{app: a, dev: dev, log: log, hook: cfg.hook, conns: map[uint32]*serverConn{},
		maxConns: cfg.MaxConns, ackTO: cfg.ACKTimeout, keepAlive: cfg.KeepAlive}
	switch {
	case s.maxConns < 0 || s.maxConns > ib.MaxCQE/(recvDepth+1):
		return nil, fmt.Errorf("kv: MaxConns %d: want 0 (the default, %d) to %d", s.maxConns, DefaultMaxConns, ib.MaxCQE/(recvDepth+1))
	case s.ackTO > 31:
		return nil, fmt.Errorf("kv: ACKTimeout %d: want 0 (the default, %d) to 31", s.ackTO, DefaultServerACKTimeout)
	}
	if s.maxConns == 0 {
		s.maxConns = DefaultMaxConns
	}
	if s.ackTO == 0 {
		s.ackTO = DefaultServerACKTimeout
	}
	if s.keepAlive == 0 {
		s.keepAlive = DefaultKeepAlive
	}
	var err error
	if s.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	// Remote READ only: the index and extents are the server's to write.
	if s.tableMR, err = s.pd.RegMR(a.table.Memory(), ib.AccessRemoteRead); err != nil {
		s.release()
		return nil, fmt.Errorf("kv: registering the table: %w", err)
	}
	if s.recvCQ, err = dev.CreateCQ(recvDepth * s.maxConns); err != nil {
		s.release()
		return nil, err
	}
	// A client's responses (one per receive) and a keepalive.
	if s.sendCQ, err = dev.CreateCQ((recvDepth + 1) * s.maxConns); err != nil {
		s.release()
		return nil, err
	}
	var e [8]byte
	_, _ = rand.Read(e[:])
	tc := a.table.Config()
	s.hello = hello{epoch: binary.LittleEndian.Uint64(e[:]), rkey: s.tableMR.RKey(), nbuckets: uint32(tc.NBuckets),
		indexAddr: s.tableMR.IOVA(), extentSize: uint32(tc.ExtentSize), maxProbe: uint32(tc.MaxProbe),
		maxMsg: uint32(s.maxMsg())}
	if s.l, err = rdmacm.Listen(dev, addr, nil); err != nil {
		s.release()
		return nil, fmt.Errorf("kv: listening on %v: %w", addr, err)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(2)
	go s.acceptLoop()
	go s.handlerLoop()
	if s.keepAlive > 0 {
		s.wg.Add(1)
		go s.keepaliveLoop()
	}
	return s, nil
}

// Addr is the rdma_cm address the server listens on.
func (s *RDMAServer) Addr() netip.AddrPort { return s.l.Addr() }

func (s *RDMAServer) maxMsg() int { return reqHdrLen + MaxKey + s.app.table.Config().ExtentSize }

// Conns is the number of connected clients.
func (s *RDMAServer) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *RDMAServer) acceptLoop() {
	defer s.wg.Done()
	for {
		req, err := s.l.Accept(s.ctx)
		if err != nil {
			return
		}
		if err := s.accept(req); err != nil {
			s.log.Warn("kv: connection refused", "peer", req.Remote, "err", err)
		}
		s.at("accept done")
	}
}

// at calls the test hook, if any.
func (s *RDMAServer) at(point string) {
	if s.hook != nil {
		s.hook(point)
	}
}

// accept creates the client's QP with its receives posted and accepts the
// request with the table's description in the REP.
func (s *RDMAServer) accept(req *rdmacm.Request) error {
	s.mu.Lock()
	full := len(s.conns) >= s.maxConns
	s.mu.Unlock()
	if full {
		_ = req.Reject([]byte(busyRejectReason))
		return errors.New("too many clients")
	}
	q, err := s.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: s.sendCQ, RecvCQ: s.recvCQ,
		Cap: ib.QPCap{MaxSendWR: recvDepth * 2, MaxRecvWR: recvDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: respHdrLen}})
	if err != nil {
		_ = req.Reject(nil)
		return err
	}
	c := &serverConn{qp: q, buf: make([]byte, recvDepth*s.maxMsg())}
	if c.mr, err = s.pd.RegMR(c.buf, ib.AccessLocalWrite); err != nil {
		_ = q.Destroy()
		_ = req.Reject(nil)
		return err
	}
	fail := func(err error) error {
		_ = c.free()
		return err
	}
	if err := ib.InitQP(q, ib.ConnectAttr{}); err != nil {
		_ = req.Reject(nil)
		return fail(err)
	}
	for slot := range recvDepth {
		if err := s.postRecv(c, slot); err != nil {
			_ = req.Reject(nil)
			return fail(err)
		}
	}
	// Register before the RTU can let the client's first SEND in, and
	// only while the server is open: an entry of s.conns is Close's to
	// free, and Close took its list when it set closed.
	s.at("register")
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = req.Reject(nil)
		return fail(errors.New("server closing"))
	}
	s.conns[q.Num()] = c
	s.mu.Unlock()
	s.at("accepting")
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	conn, err := req.Accept(ctx, q, &rdmacm.ConnParam{PrivateData: s.hello.append(nil),
		ResponderResources: responderDepth, RNRRetryCount: 7, ACKTimeout: s.ackTO})
	cancel()
	// Whoever takes c out of s.conns frees it: here, unless Close (which
	// empties the map) or kill took it meanwhile.
	if err != nil {
		if s.take(c) {
			return fail(err)
		}
		return err
	}
	s.mu.Lock()
	mine := s.conns[q.Num()] == c
	if mine {
		c.conn = conn
	}
	s.mu.Unlock()
	if !mine {
		// Close took its list of connections before this one was
		// established, or kill found its QP failed: end it here (they
		// free the QP).
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = conn.Disconnect(ctx)
		return nil
	}
	s.wg.Add(1)
	go s.watch(c)
	return nil
}

// watch forgets a connection once it ended, and frees its QP once the CM
// has forgotten it too, unless kill did first (a connection's end flushes
// its receives, which kill takes for a failure).
func (s *RDMAServer) watch(c *serverConn) {
	defer s.wg.Done()
	select {
	case <-c.conn.Done():
	case <-s.ctx.Done():
		return // Close disconnects and frees
	}
	for {
		select {
		case ev := <-c.conn.Events():
			if ev.Type != rdmacm.EventTimewaitExit {
				continue
			}
		case <-s.ctx.Done():
			return
		}
		break
	}
	if s.take(c) {
		_ = c.free()
	}
}

// take removes c from s.conns if it is still there, and reports whether
// it was: the caller then owns it and frees it. (Close empties the map;
// kill and watch race for an ended connection.)
func (s *RDMAServer) take(c *serverConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	mine := s.conns[c.qp.Num()] == c
	if mine {
		delete(s.conns, c.qp.Num())
	}
	return mine
}

// free destroys the connection's QP, then deregisters its receive
// buffers.
func (c *serverConn) free() error { return errors.Join(c.qp.Destroy(), c.mr.Dereg()) }

func (s *RDMAServer) postRecv(c *serverConn, slot int) error {
	m := s.maxMsg()
	return c.qp.PostRecv(ib.RecvWR{ID: uint64(slot), SGL: []ib.SGE{{Addr: c.mr.IOVA() + uint64(slot*m), Length: uint32(m), LKey: c.mr.LKey()}}})
}

// handlerLoop is the server application: it is the only code the server
// runs per request, and it runs only for SENDs (PUT, DELETE). When the
// handlers' CPU is measured its goroutine is locked to a thread, so the
// thread's CPU time is its own (App.MeasureHandlerCPU).
func (s *RDMAServer) handlerLoop() {
	defer s.wg.Done()
	defer s.app.handlerThread()()
	wcs := make([]ib.WC, 32)
	sends := make([]ib.WC, 64)
	var out []byte
	m := s.maxMsg()
	for {
		n, err := s.recvCQ.WaitPoll(s.ctx, wcs)
		if err != nil {
			return
		}
		t0 := s.app.handlerCPU()
		for _, wc := range wcs[:n] {
			c := s.conn(wc.QPNum)
			if c == nil {
				continue
			}
			if wc.Status != ib.WCSuccess {
				// Flushed (the connection ended, or its QP failed
				// sending): nothing more will arrive on it.
				s.kill(c, wc.Status)
				continue
			}
			c.active.Store(true)
			slot := int(wc.ID)
			out = s.app.handle(&s.app.rdma, c.buf[slot*m:slot*m+int(wc.ByteLen)], out[:0])
			if err := s.postRecv(c, slot); err != nil {
				continue
			}
			_ = c.qp.PostSend(ib.SendWR{Opcode: ib.WRSend, Flags: ib.SendSignaled | ib.SendInline, Inline: out})
		}
		s.reapSends(sends)
		s.app.rdma.cpuNanos.Add(s.app.handlerCPU() - t0)
	}
}

// conn returns the connection of QP qpn, nil if it has none.
func (s *RDMAServer) conn(qpn uint32) *serverConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns[qpn]
}

// reapSends polls the send CQ empty: the handler's responses and the
// keepalives. A failed one means the client's QP stopped answering
// (RETRY_EXC_ERR) or the QP is in ERR anyway: its connection is freed.
func (s *RDMAServer) reapSends(wcs []ib.WC) {
	for {
		n := s.sendCQ.Poll(wcs)
		if n == 0 {
			return
		}
		for _, wc := range wcs[:n] {
			c := s.conn(wc.QPNum)
			if c == nil {
				continue
			}
			if wc.ID == keepaliveID {
				c.probing.Store(false)
				if wc.Status == ib.WCSuccess {
					s.probesAcked.Add(1)
				}
			}
			if wc.Status != ib.WCSuccess {
				s.kill(c, wc.Status)
			}
		}
	}
}

// keepaliveLoop probes, every s.keepAlive, each established connection
// that received no request since the last round and has no probe
// outstanding: a signaled zero-length RDMA WRITE, which needs no memory
// or rkey at the client (IBA 9.4.4; rdma_rxe and rxed ACK it without a
// check) and completes there without a completion. The previous round's
// probes have completed by then (unless s.keepAlive is shorter than the
// QP's retries), so a failed one is seen here if not by the handler
// first (the QP's ERR flushes its receives).
func (s *RDMAServer) keepaliveLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.keepAlive)
	defer t.Stop()
	wcs := make([]ib.WC, 64)
	var idle []*serverConn
	for {
		select {
		case <-t.C:
		case <-s.ctx.Done():
			return
		}
		s.reapSends(wcs)
		idle = idle[:0]
		s.mu.Lock()
		for _, c := range s.conns {
			if c.conn != nil && !c.active.Swap(false) && !c.probing.Load() {
				idle = append(idle, c)
			}
		}
		s.mu.Unlock()
		for _, c := range idle {
			c.probing.Store(true)
			if err := c.qp.PostSend(ib.SendWR{ID: keepaliveID, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled}); err != nil {
				s.kill(c, err)
			}
		}
	}
}

// kill frees a connection whose QP failed: its client stopped answering
// (a keepalive or a response ran out of retries), or the QP went to ERR
// for another reason (the connection ended: its receives are flushed).
// It takes the connection's slot at once; the DREQ it sends (if the
// connection had not ended) is not waited for: the CM retries it alone,
// and the QP number is not reused meanwhile (the engine holds destroyed
// numbers back).
func (s *RDMAServer) kill(c *serverConn, why any) {
	if !s.take(c) {
		return
	}
	s.mu.Lock()
	conn := c.conn // set under mu by accept
	s.mu.Unlock()
	if conn != nil {
		select {
		case <-conn.Done(): // ended by the CM: its end flushed the QP
		default:
			s.log.Info("kv: connection failed, freed", "peer", conn.RemoteAddr(), "why", why)
			done, cancel := context.WithCancel(context.Background())
			cancel() // send the DREQ, do not wait for the DREP
			_ = conn.Disconnect(done)
		}
	}
	_ = c.free()
}

// Close stops listening, disconnects every client (each sees its
// connection end: ErrConnLost), and frees the server's resources,
// whatever accept was doing meanwhile; an error says one could not be
// freed. The table and the device stay.
func (s *RDMAServer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	conns := make([]*serverConn, 0, len(s.conns))
	var open []*rdmacm.Conn // read under mu: accept sets c.conn under it
	for _, c := range s.conns {
		conns = append(conns, c)
		if c.conn != nil {
			open = append(open, c.conn)
		}
	}
	s.conns = map[uint32]*serverConn{}
	s.mu.Unlock()
	s.at("closing")
	_ = s.l.Close()
	var wg sync.WaitGroup
	for _, conn := range open {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = conn.Disconnect(ctx)
		}()
	}
	wg.Wait()
	s.cancel()
	s.wg.Wait() // the accept loop too: every entry Close may free is in conns
	var errs []error
	for _, c := range conns {
		errs = append(errs, c.free())
	}
	errs = append(errs, s.release())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kv: closing the server: %w", err)
	}
	return nil
}

// release frees the server's own resources; an error says one is still
// in use (a connection's QP or region was left behind).
func (s *RDMAServer) release() error {
	var errs []error
	if s.sendCQ != nil {
		errs = append(errs, s.sendCQ.Destroy())
	}
	if s.recvCQ != nil {
		errs = append(errs, s.recvCQ.Destroy())
	}
	if s.tableMR != nil {
		errs = append(errs, s.tableMR.Dereg())
	}
	if s.pd != nil {
		errs = append(errs, s.pd.Dealloc())
	}
	return errors.Join(errs...)
}
