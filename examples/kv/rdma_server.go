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
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
)

// RDMAServer serves an App's table over RDMA: the table is registered for
// remote READ only (clients cannot write it), each client connects with
// rdma_cm and gets its own RC QP, and one handler goroutine applies the
// PUTs and DELETEs that arrive by SEND.
//
// mu guards conns and closed; the accept loop, the per-connection
// watchers and Close meet there. The handler owns the receive buffers.
type RDMAServer struct {
	app     *App
	dev     *ib.Device
	log     *slog.Logger
	l       *rdmacm.Listener
	pd      *ib.PD
	tableMR *ib.MR
	recvCQ  *ib.CQ
	sendCQ  *ib.CQ
	hello   hello
	hook    func(point string)
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

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
}

const (
	recvDepth      = 4 // a client has one request outstanding; a few spare
	maxConns       = 256
	serverCQDepth  = recvDepth * maxConns
	responderDepth = 16
)

// RDMAServerConfig configures ServeRDMA.
type RDMAServerConfig struct {
	Logger *slog.Logger // nil: silent

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
	s := &RDMAServer{app: a, dev: dev, log: log, hook: cfg.hook, conns: map[uint32]*serverConn{}}
	var err error
	if s.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	// Remote READ only: the index and extents are the server's to write.
	if s.tableMR, err = s.pd.RegMR(a.table.Memory(), ib.AccessRemoteRead); err != nil {
		s.release()
		return nil, fmt.Errorf("kv: registering the table: %w", err)
	}
	if s.recvCQ, err = dev.CreateCQ(serverCQDepth); err != nil {
		s.release()
		return nil, err
	}
	if s.sendCQ, err = dev.CreateCQ(serverCQDepth); err != nil {
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
	full := len(s.conns) >= maxConns
	s.mu.Unlock()
	if full {
		_ = req.Reject([]byte("kv: too many clients"))
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
		_ = q.Destroy()
		_ = c.mr.Dereg()
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
		ResponderResources: responderDepth, RNRRetryCount: 7})
	cancel()
	// Whoever takes c out of s.conns frees it: here, unless Close (which
	// empties the map) took it meanwhile.
	s.mu.Lock()
	mine := s.conns[q.Num()] == c
	switch {
	case !mine:
	case err != nil:
		delete(s.conns, q.Num())
	default:
		c.conn = conn
	}
	s.mu.Unlock()
	if err != nil {
		if mine {
			return fail(err)
		}
		return err
	}
	if !mine {
		// Close took its list of connections before this one was
		// established: end it here (Close frees the QP).
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
// has forgotten it too.
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
	s.mu.Lock()
	_, mine := s.conns[c.qp.Num()]
	delete(s.conns, c.qp.Num())
	s.mu.Unlock()
	if mine {
		_ = c.qp.Destroy()
		_ = c.mr.Dereg()
	}
}

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
			s.mu.Lock()
			c := s.conns[wc.QPNum]
			s.mu.Unlock()
			if c == nil || wc.Status != ib.WCSuccess {
				continue // flushed by a connection's end
			}
			slot := int(wc.ID)
			out = s.app.handle(&s.app.rdma, c.buf[slot*m:slot*m+int(wc.ByteLen)], out[:0])
			if err := s.postRecv(c, slot); err != nil {
				continue
			}
			_ = c.qp.PostSend(ib.SendWR{Opcode: ib.WRSend, Flags: ib.SendSignaled | ib.SendInline, Inline: out})
		}
		for s.sendCQ.Poll(sends) > 0 {
		}
		s.app.rdma.cpuNanos.Add(s.app.handlerCPU() - t0)
	}
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
		errs = append(errs, c.qp.Destroy(), c.mr.Dereg())
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
