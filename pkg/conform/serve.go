package conform

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/rxed/rxed/pkg/oob"
)

// Requester mode (Config.Serve): the engine plays the tool's server. The
// peer's client connects, exchanges its QP's numbers over the tool's TCP
// exchange and then drives its traffic at us; each scenario decides what
// its requests are answered with.

// serveState is the engine's responder towards the peer's requests: what a
// plain, conformant responder keeps (IBA 9.7.5: the expected PSN, the MSN,
// saved atomic results), so that a scenario can answer every request it
// does not manipulate the way a correct peer would and let the tool finish
// its run.
//
// Locking: used only by the scenario's goroutine (through Conn's methods);
// toolDone is written once by the perftest exchange's goroutine.
type serveState struct {
	ePSN    uint32 // the next request PSN we expect from the peer
	msn     uint32 // messages executed
	nakSent bool   // a sequence NAK for ePSN is outstanding (NAK once)
	// lastResp is the PSN of the latest ACK or response sent.
	lastResp uint32
	msgLen   int // bytes of the SEND in progress (a pingpong answer is that long)
	// atomics are the saved results of executed atomics by PSN, and words
	// our "memory" for them.
	atomics map[uint32]uint64
	words   map[uint64]uint64
	reads   []readReq // the latest executed READs, for retries from inside
	// broken: a scenario knows the peer's QP is gone (a fatal NAK, retry
	// exhaustion): closing does not wait for the tool's run.
	broken bool

	// toolDone receives the end of the peer tool's exchange (perftest:
	// nil after its closing exchange, an error when it closed without);
	// nil for pingpong, whose exchange ends before the traffic.
	toolDone chan error
	toolErr  error
	ended    bool
	cancel   context.CancelFunc
}

// readReq is an executed READ: its first PSN, address and length.
type readReq struct {
	psn uint32
	va  uint64
	n   int
}

// Accept waits for the peer's client and plays its tool's server
// (requester scenarios): a TCP listener on Local and the tool's port for
// one client, the tool's exchange, and a link to the address the client
// announced. The peer's first request may follow right after. The caller
// closes the Conn.
func Accept(ctx context.Context, cfg *Config, o ConnOptions) (*Conn, error) {
	return accept(ctx, cfg, o, nil)
}

// accept is Accept with everything opened through sc.
func accept(ctx context.Context, cfg *Config, o ConnOptions, sc *scope) (*Conn, error) {
	if cfg.Tool.UD() {
		return nil, fmt.Errorf("%s has no requester scenarios (UD)", cfg.Tool)
	}
	c := &Conn{Cfg: cfg, Tool: cfg.Tool, OurQPN: randomQPN(), PSN: random24(), MTU: cfg.MTU, sc: sc,
		srv: &serveState{atomics: map[uint32]uint64{}, words: map[uint64]uint64{}}}
	if o.SetPSN {
		c.PSN = o.PSN & 0xffffff
	}
	addr := net.JoinHostPort(cfg.Local.String(), strconv.Itoa(int(cfg.OOBPort)))
	var err error
	if cfg.Tool.Perftest() {
		err = c.acceptPerftest(ctx, addr)
	} else {
		err = c.acceptPingpong(ctx, addr)
	}
	if err != nil {
		if c.Link != nil {
			_ = c.Link.Close()
		}
		return nil, err
	}
	c.srv.ePSN = c.PeerPSN
	return c, nil
}

// openServeLink binds our RoCE socket towards the client's announced GID
// before we answer its exchange, so that its first request finds it.
func (c *Conn) openServeLink(gid [16]byte, tcpPeer net.Addr) error {
	peer := netip.AddrFrom16(gid).Unmap()
	if peer.IsUnspecified() || !peer.IsValid() {
		if ta, ok := tcpPeer.(*net.TCPAddr); ok {
			peer, _ = netip.AddrFromSlice(ta.IP)
			peer = peer.Unmap()
		}
	}
	c.Cfg.Peer = peer
	l, err := c.sc.openLink(netip.AddrPortFrom(c.Cfg.Local, c.Cfg.RoCEPort), netip.AddrPortFrom(peer, c.Cfg.RoCEPort))
	if err != nil {
		return err
	}
	c.Link = l
	c.Link.ourQPN, c.Link.peerQPN = c.OurQPN, c.PeerQPN
	return nil
}

func (c *Conn) acceptPerftest(ctx context.Context, addr string) error {
	cfg := c.Cfg
	var ln *oob.PerftestListener
	// The runner holds the listener until the scenario's deadline, so that
	// an accept phase running late cannot keep the next scenario's port.
	err := c.sc.open(true, func() (func(), error) {
		var err error
		ln, err = oob.ListenPerftest(addr, &oob.SessionConfig{Options: oob.Options{Timeout: cfg.Timeout, Logger: cfg.Logger}})
		if err != nil {
			return nil, err
		}
		return func() { _ = ln.Close() }, nil
	})
	if err != nil {
		return fmt.Errorf("listening for the %s client on %s: %v", cfg.Tool, addr, err)
	}
	// One client per scenario: the listener closes once it is accepted,
	// so a client started early waits for the next scenario's (refused).
	defer ln.Close()
	listening(ln.Addr())
	sess, err := ln.Accept(ctx)
	if err != nil {
		return fmt.Errorf("no %s client connected to %s: %v", cfg.Tool, addr, err)
	}
	if err := c.sc.hold(func() { _ = sess.CloseWithoutExchange() }); err != nil {
		return err
	}
	c.sess = sess
	neg, err := sess.Negotiate(ctx, oob.MTUEnum(cfg.MTU))
	if err != nil {
		_ = sess.CloseWithoutExchange()
		return fmt.Errorf("%s exchange: %v", cfg.Tool, err)
	}
	c.MTU = oob.MTUBytes(neg.MTU)
	c.test = testOf(cfg.Tool)
	c.key = oob.Key{OutReads: 16, QPN: c.OurQPN, PSN: c.PSN, GID: cfg.Local.As16()}
	if cfg.Tool.RDMA() {
		// The buffer the client's requests name; the engine answers them
		// from a pattern, it has no memory behind it.
		c.key.RKey, c.key.VAddr = 0x2000, 0x200000
	}
	var tcpPeer net.Addr
	if a, err := net.ResolveTCPAddr("tcp", sess.RemoteAddr()); err == nil {
		tcpPeer = a
	}
	remotes, err := sess.Connect(ctx, c.test, []oob.Key{c.key}, func(remotes []oob.Key) error {
		c.PeerQPN, c.PeerPSN, c.RKey, c.VA, c.PeerOutReads = remotes[0].QPN, remotes[0].PSN, remotes[0].RKey, remotes[0].VAddr, int(remotes[0].OutReads)
		return c.openServeLink(remotes[0].GID, tcpPeer)
	})
	if err != nil {
		_ = sess.CloseWithoutExchange()
		return fmt.Errorf("%s exchange: %v", cfg.Tool, err)
	}
	_ = remotes
	// The client runs its test and then makes its closing exchange; we
	// wait for it in the background: its outcome says whether the tool
	// finished its run or gave up (an error it reports).
	fctx, cancel := context.WithCancel(context.Background())
	c.srv.cancel = cancel
	c.srv.toolDone = make(chan error, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		_, err := sess.Finish(fctx, c.test, c.key, oob.BWReport{Size: 8, Iters: 1})
		c.srv.toolDone <- err
	}()
	// The runner ends the waiter with the scenario: closing the session
	// interrupts its read, and the scope waits for the goroutine.
	return c.sc.hold(func() {
		cancel()
		_ = sess.CloseWithoutExchange()
		<-finished
	})
}

func (c *Conn) acceptPingpong(ctx context.Context, addr string) error {
	cfg := c.Cfg
	var ln *oob.PingpongListener
	err := c.sc.open(true, func() (func(), error) {
		var err error
		ln, err = oob.ListenPingpong(addr, &oob.Options{Timeout: cfg.Timeout, Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
		return func() { _ = ln.Close() }, nil
	})
	if err != nil {
		return fmt.Errorf("listening for the %s client on %s: %v", cfg.Tool, addr, err)
	}
	defer ln.Close()
	listening(ln.Addr())
	local := oob.PingpongDest{QPN: c.OurQPN, PSN: c.PSN, GID: cfg.Local.As16()}
	_, err = ln.Exchange(ctx, local, func(remote oob.PingpongDest) error {
		c.PeerQPN, c.PeerPSN = remote.QPN, remote.PSN
		return c.openServeLink(remote.GID, nil)
	})
	if err != nil {
		return fmt.Errorf("%s exchange: %v", cfg.Tool, err)
	}
	return nil
}

// ToolEnded waits up to d for the peer tool's exchange to end and reports
// how: err is nil when the tool made its closing exchange (it finished its
// run), the exchange's error when it closed without (it gave up and
// reported an error). ok is false when it had not ended, or the tool's
// exchange ends before its traffic (pingpong).
func (c *Conn) ToolEnded(ctx context.Context, d time.Duration) (err error, ok bool) {
	s := c.srv
	if s == nil || s.toolDone == nil {
		return nil, false
	}
	if s.ended {
		return s.toolErr, true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case s.toolErr = <-s.toolDone:
		s.ended = true
		return s.toolErr, true
	case <-t.C:
	case <-ctx.Done():
	}
	return nil, false
}

// ToolReportsEnd reports whether the tool's end is observable (perftest).
func (c *Conn) ToolReportsEnd() bool { return c.srv != nil && c.srv.toolDone != nil }

// MarkBroken records that the peer's QP is known to be in the error
// state: closing then lets the tool end on its own.
func (c *Conn) MarkBroken() {
	if c.srv != nil {
		c.srv.broken = true
	}
}

// closeServe ends a requester scenario: unless the peer's QP is broken,
// it answers the peer's requests as a conformant responder until the
// tool's run is over (perftest: its closing exchange; pingpong: its
// iterations), so the client ends cleanly; then it closes.
func (c *Conn) closeServe(ctx context.Context) error {
	s := c.srv
	var err error
	if !s.broken {
		err = c.ServeToEnd(ctx)
	}
	if s.cancel != nil {
		if !s.ended {
			// Give a tool that is ending anyway a moment for its exchange.
			c.ToolEnded(ctx, 50*time.Millisecond)
		}
		s.cancel()
	}
	if c.Link != nil {
		_ = c.Link.Close()
	}
	return err
}

// ServeToEnd answers every request as a conformant responder until the
// tool's run is over or ctx ends.
func (c *Conn) ServeToEnd(ctx context.Context) error {
	s := c.srv
	for ctx.Err() == nil {
		if s.toolDone != nil {
			if err, ok := c.ToolEnded(ctx, 0); ok {
				if err != nil {
					return fmt.Errorf("the tool ended without its closing exchange: %v", err)
				}
				return nil
			}
		} else if int(s.msn) >= c.Cfg.PeerIters {
			// Pingpong: every iteration answered; let our last answer's
			// ACK come back and stop.
			c.Collect(ctx, 20*time.Millisecond, nil)
			return nil
		}
		if r, ok := c.NextRequest(ctx, 20*time.Millisecond); ok {
			c.Serve(r)
		}
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("the tool did not finish its run (%d messages answered)", s.msn)
	}
	return ctx.Err()
}
