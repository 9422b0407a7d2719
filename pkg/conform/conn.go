package conform

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"

	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/wire"
)

// DefaultPKey is the default partition key every tool's QP uses.
const DefaultPKey = 0xffff

// UDQKey is the Q_Key of ibv_ud_pingpong (and perftest's UD tests).
const UDQKey = 0x11111111

// Config describes the peer and how to reach it.
type Config struct {
	Tool Tool
	// Local is the engine's address (its GID); Peer the peer's (responder
	// mode: the tool's server).
	Local, Peer netip.Addr
	// OOBPort is the tools' TCP port (-p; 18515 by default). RoCEPort is
	// the UDP port of both ends (4791 by default).
	OOBPort, RoCEPort uint16
	// Serve: play the tool's server; the peer's client connects to Local.
	Serve bool
	// Timeout bounds each scenario (default 10 s).
	Timeout time.Duration
	// MTU is the path MTU the engine asks for, in bytes (default 1024).
	MTU int
	// PeerIters is the peer tool's -n: send tools need that many messages
	// before they finish (default 1000).
	PeerIters int
	// SendSize is the peer tool's -s for ib_send_bw: every SEND then has
	// exactly that size (rxed perf send checks it); 0 lets scenarios pick.
	SendSize int
	// PeerACKTimeout and PeerRetry are the peer requester's local ACK
	// timeout exponent and retry count (the tools' defaults: 14 and 7),
	// against which retransmissions are judged.
	PeerACKTimeout uint8
	PeerRetry      int
	// PeerRNRRetry is the peer requester's rnr_retry (7: infinite, what
	// perftest, ibv_rc_pingpong and rxed use); PeerRNRRetrySet tells a
	// configured 0 from the default.
	PeerRNRRetry    int
	PeerRNRRetrySet bool
	// PeerParamsSet: the three values above were given (not the tools'
	// defaults); evidence says which.
	PeerParamsSet bool
	Logger        *slog.Logger
}

func (c *Config) defaults() {
	if c.OOBPort == 0 {
		c.OOBPort = oob.DefaultPort
	}
	if c.RoCEPort == 0 {
		c.RoCEPort = wire.UDPPort
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.MTU == 0 {
		c.MTU = 1024
	}
	if c.PeerIters <= 0 {
		c.PeerIters = 1000
	}
	if c.PeerACKTimeout == 0 {
		c.PeerACKTimeout = 14
	}
	if c.PeerRetry == 0 {
		c.PeerRetry = 7
	}
	if c.PeerRNRRetry == 0 && !c.PeerRNRRetrySet {
		c.PeerRNRRetry = 7
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Conn is one scenario's connection to the peer: the link, both QPs'
// numbers and PSNs, and the peer's buffer. PSN is the next PSN the peer
// expects from us; helpers advance it as requests are accepted.
type Conn struct {
	*Link
	Cfg     *Config
	Tool    Tool
	OurQPN  uint32
	PeerQPN uint32
	PSN     uint32 // our next request PSN
	PeerPSN uint32 // the peer's initial send PSN
	RKey    uint32
	VA      uint64
	MTU     int
	// PeerOutReads is the RDMA READ/atomic depth the peer announced.
	PeerOutReads int

	sess *oob.Session
	key  oob.Key
	test oob.Test
	// srv is the responder state of requester mode (Accept); nil when
	// the peer is the responder.
	srv *serveState
	// sc is the runner's scope through which the connection opens its
	// listener, session and link (nil: Close alone closes them).
	sc *scope
}

// ConnOptions choose what a scenario needs of its connection.
type ConnOptions struct {
	// PSN, when SetPSN, is our initial PSN (the peer's expected PSN).
	PSN    uint32
	SetPSN bool
}

func random24() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint32(b[:]) & 0xffffff
}

func randomQPN() uint32 {
	for {
		if q := random24(); q > 0x10 {
			return q
		}
	}
}

func testOf(t Tool) oob.Test {
	switch t {
	case IBReadBW:
		return oob.Test{Verb: oob.VerbRead}
	case IBAtomicBW:
		return oob.Test{Verb: oob.VerbAtomic}
	case IBSendBW:
		return oob.Test{Verb: oob.VerbSend}
	}
	return oob.Test{Verb: oob.VerbWrite}
}

// betweenServerRuns reports whether err, from connecting to a peer tool's
// exchange, is what a one-shot server restarted between scenarios gives
// while it is down: refused, reset (a connection that reached a
// listener's backlog as the old instance exited), or closed before the
// exchange's first message. The pingpong exchange retried refused and
// closed only, and a reset at connect time failed a scenario in CI
// (TestConformAgainstRxed/ibv_rc_pingpong, run at b36d65b).
func betweenServerRuns(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, oob.ErrClosed)
}

// dialRetry connects to the peer's exchange, retrying while the port is
// closed (a one-shot tool restarted between scenarios), until ctx ends.
func dialRetry(ctx context.Context, local, peer netip.Addr, port uint16) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: local.AsSlice()}}
	addr := net.JoinHostPort(peer.String(), strconv.Itoa(int(port)))
	wait := 10 * time.Millisecond
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		if !betweenServerRuns(err) || ctx.Err() != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("no %s server at %s: %v", "tool", addr, err)
			}
			return nil, fmt.Errorf("connecting to %s: %v", addr, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no server listening at %s within the scenario's deadline", addr)
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// Dial connects to the peer's tool as its client (responder mode). The
// caller closes the Conn.
func Dial(ctx context.Context, cfg *Config, o ConnOptions) (*Conn, error) {
	return dial(ctx, cfg, o, nil)
}

// dial is Dial with everything opened through sc.
func dial(ctx context.Context, cfg *Config, o ConnOptions, sc *scope) (*Conn, error) {
	c := &Conn{Cfg: cfg, Tool: cfg.Tool, OurQPN: randomQPN(), PSN: random24(), sc: sc}
	if o.SetPSN {
		c.PSN = o.PSN & 0xffffff
	}
	local := netip.AddrPortFrom(cfg.Local, cfg.RoCEPort)
	peer := netip.AddrPortFrom(cfg.Peer, cfg.RoCEPort)
	var err error
	if cfg.Tool.Perftest() {
		err = c.dialPerftest(ctx)
	} else {
		err = c.dialPingpong(ctx)
	}
	if err != nil {
		return nil, err
	}
	// The link opens after the exchange: the peer sends nothing before
	// our first packet (pingpong servers answer, perftest servers idle).
	if c.Link, err = sc.openLink(local, peer); err != nil {
		if c.sess != nil {
			_ = c.sess.CloseWithoutExchange()
		}
		return nil, err
	}
	c.Link.ourQPN, c.Link.peerQPN = c.OurQPN, c.PeerQPN
	if cfg.Tool.Echoes() {
		c.Link.setAutoAck(c.OurQPN, c.PeerQPN, c.PeerPSN)
	}
	return c, nil
}

func (c *Conn) dialPerftest(ctx context.Context) error {
	cfg := c.Cfg
	var neg oob.Negotiated
	for {
		nc, err := dialRetry(ctx, cfg.Local, cfg.Peer, cfg.OOBPort)
		if err != nil {
			return err
		}
		sess := oob.NewSession(nc, oob.Client, &oob.SessionConfig{Options: oob.Options{Timeout: cfg.Timeout, Logger: cfg.Logger}})
		if err := c.sc.hold(func() { _ = sess.CloseWithoutExchange() }); err != nil {
			return err
		}
		c.sess = sess
		neg, err = c.sess.Negotiate(ctx, oob.MTUEnum(cfg.MTU))
		if err == nil {
			break
		}
		// Closed before the versions: a one-shot server between two runs
		// (its old listener's backlog). Try again while the deadline lasts.
		if !errors.Is(err, oob.ErrClosed) || ctx.Err() != nil {
			return fmt.Errorf("%s exchange: %v", cfg.Tool, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s exchange: %v", cfg.Tool, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	c.MTU = oob.MTUBytes(neg.MTU)
	c.test = testOf(cfg.Tool)
	c.key = oob.Key{OutReads: 16, QPN: c.OurQPN, PSN: c.PSN, GID: cfg.Local.As16()}
	if cfg.Tool.RDMA() {
		// A buffer that is never honoured: the peer's tool wants one.
		c.key.RKey, c.key.VAddr = 0x1000, 0x10000
	}
	remotes, err := c.sess.Connect(ctx, c.test, []oob.Key{c.key}, nil)
	if err != nil {
		return fmt.Errorf("%s exchange: %v", cfg.Tool, err)
	}
	r := remotes[0]
	if err := checkToolKey(cfg.Tool, r); err != nil {
		_ = c.sess.CloseWithoutExchange()
		return err
	}
	c.PeerQPN, c.PeerPSN, c.RKey, c.VA, c.PeerOutReads = r.QPN, r.PSN, r.RKey, r.VAddr, int(r.OutReads)
	return nil
}

// checkToolKey rejects a peer whose key says it runs another tool than
// the one asked for: an RDMA tool advertises a buffer with remote access
// (an R_Key), a send tool none. perftest puts its buffer's address in
// every test's key, ib_send_bw's too (rdma_rxe's ib_send_bw: rkey 0, a
// real vaddr; /work/shared/pcaps/OOB.md), so only the R_Key tells them
// apart.
func checkToolKey(t Tool, k oob.Key) error {
	switch {
	case t.RDMA() && k.RKey == 0 && k.VAddr == 0:
		return fmt.Errorf("the peer is not an %s server: its key advertises no buffer (a send test?)", t)
	case t == IBSendBW && k.RKey != 0:
		return fmt.Errorf("the peer is not an ib_send_bw server: its key advertises a buffer (rkey %#x), as RDMA tests do", k.RKey)
	}
	return nil
}

func (c *Conn) dialPingpong(ctx context.Context) error {
	cfg := c.Cfg
	c.MTU = cfg.MTU
	addr := net.JoinHostPort(cfg.Peer.String(), strconv.Itoa(int(cfg.OOBPort)))
	local := oob.PingpongDest{QPN: c.OurQPN, PSN: c.PSN, GID: cfg.Local.As16()}
	var remote oob.PingpongDest
	var err error
	wait := 10 * time.Millisecond
	for {
		// every step of the exchange within what is left of the scenario
		step := cfg.Timeout
		if d, ok := ctx.Deadline(); ok {
			step = min(step, max(time.Until(d), time.Millisecond))
		}
		remote, err = oob.DialPingpong(ctx, addr, local, nil, &oob.Options{Timeout: step, Logger: cfg.Logger})
		if err == nil || !betweenServerRuns(err) || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("%s exchange: %v", cfg.Tool, err)
	}
	c.PeerQPN, c.PeerPSN = remote.QPN, remote.PSN
	return nil
}

// Close ends the connection: it lets the peer's tool finish its run where
// that is possible (send tools need their iterations, perftest its closing
// exchange) so that a one-shot server restarts clean, then closes.
func (c *Conn) Close(ctx context.Context) error {
	if c.srv != nil {
		return c.closeServe(ctx)
	}
	var err error
	// A peer whose QP is in ERR (it answered with a fatal NAK) cannot
	// finish its iterations: topping them up only waits for the bound.
	broken := c.peerBroken()
	switch {
	case broken && (c.Tool == IBSendBW || c.Tool.Echoes()):
		err = errors.New("the peer's QP is in the error state")
	case c.Tool == IBSendBW || c.Tool.Echoes():
		err = c.topUp(ctx)
	}
	if c.sess != nil {
		if err == nil {
			_, err = c.sess.Finish(ctx, c.test, c.key, oob.BWReport{Size: 8, Iters: 1})
		}
		if err != nil {
			_ = c.sess.CloseWithoutExchange()
		}
	}
	if c.Link != nil {
		_ = c.Link.Close()
	}
	return err
}

// peerBroken reports whether the peer answered with a NAK that moves its
// responder to the error state (invalid request, remote access or remote
// operational error: IBA 9.7.5.2.3-9.7.5.2.5), after which its tool
// cannot finish its run.
// A NAK the link dropped (another P_Key, a bad ICRC) is not one: no
// requester takes it.
func (c *Conn) peerBroken() bool {
	broken := false
	accepted(c.Trace(), func(p *wire.Packet) {
		if p.AETH != nil && p.AETH.Syndrome().Kind() == wire.SynNAK && p.AETH.Syndrome().NAKCode() != wire.NAKPSNSeqErr {
			broken = true
		}
	})
	return broken
}
