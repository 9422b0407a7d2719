// Package daemon is `rxed serve`: a RoCEv2 engine that exports named
// memory regions (anonymous, file or shared-memory mappings) and lets
// unmodified perftest clients (ib_write_bw, ib_read_bw, ib_atomic_bw) set
// up queue pairs against one of them through perftest's out-of-band TCP
// exchange. Counters are served in Prometheus text format.
//
// Shutdown (cancelling Run's context, which `rxed serve` does on SIGTERM
// and SIGINT, or Close) stops accepting, lets running sessions finish for a grace
// period, stops the engine and msyncs every file-backed export.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// Config configures a Daemon.
type Config struct {
	// Addrs are the local addresses (the GID table, in order).
	Addrs []netip.Addr
	// Port is the UDP port (0: 4791).
	Port uint16
	// OOBAddr is the perftest exchange's TCP listen address, e.g.
	// ":18515"; "" disables it.
	OOBAddr string
	// RDMACMPort is the rdma_cm port perftest -R clients connect to
	// (rdmacm_serve.go; DefaultRDMACMPort is perftest's); 0 disables it.
	RDMACMPort uint16
	// MetricsAddr is the HTTP listen address of /metrics; "" disables it.
	MetricsAddr string
	// Exports are the regions to map and register, in order.
	Exports []ExportSpec
	// PerftestExport names the export perftest clients target; "" is the
	// first one.
	PerftestExport string
	// GIDIndex is the GID our perftest keys carry.
	GIDIndex int
	// MTU is the ibv_mtu enum offered in the perftest MTU negotiation; 0
	// is the port's active MTU.
	MTU int
	// QPTimeout is the RC local ACK timeout exponent (0: 14).
	QPTimeout uint8
	// StepTimeout bounds each out-of-band step (0: oob.DefaultTimeout).
	StepTimeout time.Duration
	// ShutdownGrace is how long running sessions may continue after the
	// context is cancelled (0: 10s; negative: none, they end at once),
	// timed on Ticker when it is set.
	ShutdownGrace time.Duration
	// MaxSessions bounds concurrent perftest sessions (0: 64).
	MaxSessions int
	// Fault, Wrap and Pcap are passed to ib.OpenDevice (fault injection,
	// transport wrapping, capture).
	Fault *transport.FaultConfig
	Wrap  func(transport.Conn) (transport.Conn, error)
	Pcap  io.Writer
	// Conn, if set, is the transport the device uses instead of UDP
	// sockets on Addrs (ib.Config.Conn: a transport.MemNetwork conn
	// embeds the daemon in an in-process network); Addrs still make up
	// the GID table. The daemon owns it.
	Conn transport.Conn
	// Logger receives structured logs; nil is silent.
	Logger *slog.Logger

	// Security (docs/security.md).

	// AllowUnverifiedGID serves perftest clients whose key announces a
	// GID other than the address of their TCP connection (perftest may
	// announce its IPv6 GID over an IPv4 exchange). Without it they are
	// refused before the export's rkey is sent: such a client could point
	// the daemon's responses at a third party. rxed clients prove the GID
	// instead (a nonce sent over RoCE, echoed over TCP) and need no flag.
	AllowUnverifiedGID bool
	// Allow lists the client networks that may use the exchange; empty
	// allows every address.
	Allow []netip.Prefix
	// Token, when not empty, is the shared secret rxed clients must prove
	// (perftest clients cannot, and are refused).
	Token []byte
	// HandshakeTimeout bounds the whole exchange up to the start of the
	// run (0: 5s); IdleTimeout ends a running session whose QPs have
	// received nothing for that long (0: 60s; negative: never).
	HandshakeTimeout time.Duration
	IdleTimeout      time.Duration
	// MaxSessionsPerSource bounds the sessions of one client address
	// (0: MaxSessions).
	MaxSessionsPerSource int
	// SessionBytes bounds the RoCE bytes the daemon sends to one session
	// (0: no bound); MaxReadLen refuses RDMA READs longer than it (0:
	// none). Both are enforced by dropping the datagrams concerned.
	SessionBytes int64
	MaxReadLen   int64
	// Now is the clock of the idle timeout (nil: time.Now).
	Now func() time.Time
	// Ticker, if set, paces the idle reaper's scans instead of a
	// time.Ticker (every IdleTimeout/4): a test that injects Now injects
	// this with it, so that a scan reads the test's clock when the test
	// says, not at a real tick. The accept loops' backoff after a failed
	// Accept waits for its first tick too (every: the delay; backoff.go),
	// and so do shutdown's ShutdownGrace (every: the grace; graceWait)
	// and an rdma_cm session's wait for the client's DREQs (cmEndGrace).
	// stop ends the ticker.
	Ticker func(every time.Duration) (c <-chan time.Time, stop func())
}

// Defaults of the security settings.
const (
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultIdleTimeout      = 60 * time.Second
	// AmplificationFactor bounds what an address that has not proved it
	// is the client's may receive: this many times what the client has
	// sent us (QUIC's anti-amplification rule, RFC 9000 section 8).
	AmplificationFactor = 3
)

// Daemon is a running rxed serve instance.
type Daemon struct {
	cfg     Config
	log     *slog.Logger
	dev     *ib.Device
	pd      *ib.PD
	exports []*Export
	target  *Export

	oobLn     tcpListener // *oob.PerftestListener (backoff.go)
	cm        cmServe     // the rdma_cm listener (rdmacm_serve.go)
	metricsLn net.Listener
	http      *http.Server
	traffic   *trafficConn
	reg       *registry
	refusing  chan struct{} // slots of goroutines answering refused clients

	// registry holds every metric of /metrics (metrics.go); sessMetrics
	// are its histograms the session code observes.
	registry    *prometheus.Registry
	sessMetrics sessionMetrics

	wg          sync.WaitGroup
	sessCtx     context.Context
	sessCancel  context.CancelFunc
	active      atomic.Int64
	total       atomic.Uint64
	failed      atomic.Uint64
	completed   atomic.Uint64
	refusedBusy atomic.Uint64 // refused at a session limit
	refusedAddr atomic.Uint64 // refused by the allowlist
	refusedGID  atomic.Uint64 // refused: unverified GID
	reclaimed   atomic.Uint64 // idle sessions ended
	hsTimeouts  atomic.Uint64 // handshakes that ran out of time
	stopOnce    sync.Once
	acceptDone  chan struct{}
	// acceptErr is the first permanent failure of an accept loop (the
	// TCP exchange's: accept_errors.go; the rdma_cm exchange's: its
	// device closed under the daemon), set by serveFailed before it
	// closes acceptFailed: Run then shuts down and returns it.
	acceptErr    error
	acceptFailed chan struct{}
	failOnce     sync.Once
	metricsDone  chan struct{}
	reapDone     chan struct{} // closed as reapLoop returns; nil when none runs
	refusals     sync.WaitGroup

	// The run's state (close.go): Close before Run frees what New
	// opened, during Run ends Run and waits for it.
	runMu     sync.Mutex
	runState  runState
	runCancel context.CancelFunc // ends Run's context
	runDone   chan struct{}      // closed as Run returns
	runErr    error              // Run's result, once runDone is closed

	// scrapeMu and scrapesOff fence the metrics gathers from the
	// device's end (scrapes.go); httpShutdown bounds the wait for the
	// metrics server's requests (0: 2s).
	scrapeMu     sync.RWMutex
	scrapesOff   bool
	httpShutdown time.Duration

	// Test hooks (nil in production): afterAccept runs in the TCP accept
	// loop as Accept has returned a client, before its admission;
	// awaitingAcceptLoop as shutdown starts waiting for that loop,
	// awaitingReaper and awaitingRefusals as it starts waiting for
	// reapLoop and the refusals; refused as a refusal's goroutine ends.
	afterAccept, awaitingAcceptLoop, awaitingReaper, awaitingRefusals, refused func()
	// afterGrant runs once an rxed client has been sent the export's
	// grant, before the session goes on.
	afterGrant func()
	// gathering runs inside each gather of the metrics, with the device
	// still open; scraped as a /metrics page has been made, still inside
	// the fence; awaitingScrapes as release starts waiting for the pages
	// in progress (only when one is).
	gathering, scraped, awaitingScrapes func()
}

// New maps and registers the exports, opens the engine and the listeners.
// Every error is one line naming the problem; nothing stays open on error.
func New(cfg Config) (*Daemon, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.QPTimeout == 0 {
		cfg.QPTimeout = 14
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 10 * time.Second
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = 64
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("no local address (give --addr)")
	}
	if cfg.GIDIndex < 0 || cfg.GIDIndex >= len(cfg.Addrs) {
		return nil, fmt.Errorf("GID index %d: the table has %d addresses", cfg.GIDIndex, len(cfg.Addrs))
	}
	names := map[string]bool{}
	for _, s := range cfg.Exports {
		if names[s.Name] {
			return nil, fmt.Errorf("export %s given twice", s.Name)
		}
		names[s.Name] = true
	}
	if cfg.PerftestExport != "" && !names[cfg.PerftestExport] {
		return nil, fmt.Errorf("perftest export %q: no export has that name", cfg.PerftestExport)
	}
	d := &Daemon{cfg: cfg, log: cfg.Logger, acceptDone: make(chan struct{}), acceptFailed: make(chan struct{}), metricsDone: make(chan struct{}),
		reg: newRegistry(cfg.MaxSessions, cfg.MaxSessionsPerSource), refusing: make(chan struct{}, 16)}
	d.sessCtx, d.sessCancel = context.WithCancel(context.Background())
	if err := d.open(); err != nil {
		_ = d.release()
		return nil, err
	}
	return d, nil
}

// open does New's work; on error the caller releases what was opened.
func (d *Daemon) open() (err error) {
	cfg := d.cfg
	// Map first: a missing or short export file is the likeliest mistake
	// and needs no socket.
	for _, s := range cfg.Exports {
		m, err := mapExport(s)
		if err != nil {
			return err
		}
		d.exports = append(d.exports, &Export{Spec: s, Mapping: m})
	}
	// The traffic wrapper goes outermost (after the caller's), so that it
	// sees what the engine sends and receives.
	wrap := func(c transport.Conn) (transport.Conn, error) {
		if cfg.Wrap != nil {
			var err error
			if c, err = cfg.Wrap(c); err != nil {
				return nil, err
			}
		}
		d.traffic = newTrafficConn(c, cfg.Now)
		return d.traffic, nil
	}
	d.dev, err = ib.OpenDevice(ib.Config{Addrs: cfg.Addrs, Port: cfg.Port, Conn: cfg.Conn, Fault: cfg.Fault, Wrap: wrap, Pcap: cfg.Pcap, Logger: cfg.Logger})
	if err != nil {
		return fmt.Errorf("opening the RoCE engine: %w", err)
	}
	// The device answers the IB CM on QP 1 as a kernel device does (REJ 8
	// when nobody listens; --rdma-cm-port adds a listener).
	if err := rdmacm.Enable(d.dev, &rdmacm.Config{Logger: cfg.Logger, Linger: 3 * time.Second}); err != nil {
		return fmt.Errorf("starting the connection manager: %v", err)
	}
	if d.pd, err = d.dev.AllocPD(); err != nil {
		return err
	}
	for _, e := range d.exports {
		e.MR, err = d.pd.RegMR(e.Mapping.Bytes(), e.Access(), mr.WithMapping(e.Mapping))
		if err != nil {
			return fmt.Errorf("export %s: registering: %v", e.Spec.Name, err)
		}
		if cfg.PerftestExport == e.Spec.Name || (cfg.PerftestExport == "" && d.target == nil) {
			d.target = e
		}
	}
	if cfg.OOBAddr != "" {
		if d.target == nil {
			return errors.New("perftest clients need an export to target (give --export)")
		}
		// Through ln: a nil *PerftestListener in d.oobLn would not be a
		// nil tcpListener.
		ln, err := oob.ListenPerftest(cfg.OOBAddr, &oob.SessionConfig{Options: oob.Options{Timeout: cfg.StepTimeout, Logger: cfg.Logger},
			Ext: &oob.ExtConfig{Token: cfg.Token, Serves: d.servesTest}})
		if err != nil {
			return err
		}
		d.oobLn = ln
	}
	if err := d.openRDMACM(); err != nil {
		return err
	}
	d.registry = d.newMetrics()
	if cfg.MetricsAddr != "" {
		d.metricsLn, err = net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("metrics listener: %w", unwrapOp(err))
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", d.metricsHandler())
		d.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	}
	return nil
}

func unwrapOp(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return fmt.Errorf("%s %s: %w", oe.Op, oe.Addr, oe.Err)
	}
	return err
}

// Device is the daemon's engine.
func (d *Daemon) Device() *ib.Device { return d.dev }

// Exports lists the registered exports.
func (d *Daemon) Exports() []*Export { return d.exports }

// OOBAddr is the address of the perftest listener (nil when disabled).
func (d *Daemon) OOBAddr() net.Addr {
	if d.oobLn == nil {
		return nil
	}
	return d.oobLn.Addr()
}

// MetricsAddr is the address of the metrics listener (nil when disabled).
func (d *Daemon) MetricsAddr() net.Addr {
	if d.metricsLn == nil {
		return nil
	}
	return d.metricsLn.Addr()
}

// Run serves until ctx is cancelled (or Close is called), or an exchange
// can take no client any more (serveFailed), then shuts down gracefully:
// stop accepting, give running sessions ShutdownGrace to finish, stop
// the engine, msync and unmap the exports. It returns that exchange's
// failure joined with the first shutdown error (a failed msync), or nil;
// ErrClosed if the daemon was closed before, and an error if Run is
// already running. A daemon runs once.
func (d *Daemon) Run(ctx context.Context) (err error) {
	ctx, err = d.startRun(ctx)
	if err != nil {
		return err
	}
	defer func() { d.endRun(err) }()
	for _, e := range d.exports {
		d.log.Info("export", "name", e.Spec.Name, "kind", e.Spec.Kind.String(), "path", e.Spec.Path,
			"bytes", e.MR.Len(), "addr", fmt.Sprintf("%#x", e.MR.IOVA()), "rkey", fmt.Sprintf("%#x", e.MR.RKey()), "ro", e.Spec.ReadOnly)
	}
	if d.http != nil {
		go func() {
			defer close(d.metricsDone)
			if err := d.http.Serve(d.metricsLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				d.log.Error("metrics server stopped", "err", err)
			}
		}()
		d.log.Info("metrics", "addr", d.metricsLn.Addr().String())
	} else {
		close(d.metricsDone)
	}
	if d.cfg.IdleTimeout > 0 && (d.oobLn != nil || d.cm.ln != nil) {
		d.reapDone = make(chan struct{})
		go d.reapLoop()
	}
	if d.oobLn != nil {
		go d.acceptLoop(ctx)
		d.log.Info("perftest exchange", "addr", d.oobLn.Addr().String(), "export", d.target.Spec.Name)
	} else {
		close(d.acceptDone)
	}
	d.startRDMACM(ctx)
	d.log.Info("serving", "addrs", fmt.Sprint(d.cfg.Addrs), "udp_port", d.dev.UDPPort())
	select {
	case <-ctx.Done():
	case <-d.acceptFailed:
		// An exchange can take no client any more (serveFailed): a
		// daemon serving on without it would look up and refuse every
		// perftest client. Run's context ends as on SIGTERM, so that the
		// other loop's backoff (which waits on it) does not hold the
		// shutdown.
		d.runCancel()
	}
	err = d.shutdown()
	// Written before acceptDone and cm.done, which shutdown waited for.
	if d.acceptErr != nil {
		return errors.Join(d.acceptErr, err)
	}
	return err
}

// serveFailed ends Run on an accept loop's permanent failure: the first
// one is Run's error (acceptErr), and acceptFailed wakes Run, which shuts
// down. An exchange that can take no client any more leaves the daemon
// looking up while it refuses every perftest client, so it stops as on
// SIGTERM, and its supervisor sees why.
func (d *Daemon) serveFailed(err error) {
	d.failOnce.Do(func() {
		d.acceptErr = err
		close(d.acceptFailed)
	})
}

// acceptLoop admits the TCP exchange's clients until shutdown closes the
// listener. An Accept that failed for a while (accept_errors.go) backs
// off (backoff.go) until Run's ctx ends; one that will fail every time
// (the listener shut down or closed under the daemon) ends the loop and,
// through serveFailed, Run, which returns it.
func (d *Daemon) acceptLoop(ctx context.Context) {
	defer close(d.acceptDone)
	var backoff acceptBackoff
	for {
		sess, err := d.oobLn.Accept(d.sessCtx)
		if err != nil {
			// Shutdown closes the listener only once ctx has ended (and
			// release, sessCtx), so a net.ErrClosed before that is
			// someone else's doing: a permanent error like any other.
			if errors.Is(err, oob.ErrCanceled) || d.sessCtx.Err() != nil || ctx.Err() != nil {
				return
			}
			if !temporaryAcceptError(err) {
				d.log.Error("perftest exchange: accept failed for good: shutting down", "addr", d.oobLn.Addr().String(), "err", err)
				d.serveFailed(fmt.Errorf("perftest exchange on %s: %w", d.oobLn.Addr(), err))
				return
			}
			delay := backoff.next()
			d.log.Warn("accept failed", "err", err, "retry_in", delay)
			if !d.wait(ctx, delay) {
				return
			}
			continue
		}
		backoff.reset()
		if d.afterAccept != nil {
			d.afterAccept()
		}
		ap, _ := netip.ParseAddrPort(sess.RemoteAddr())
		peer := ap.Addr().Unmap()
		if !allowed(d.cfg.Allow, peer) {
			// Not a word to an address outside the allowlist.
			d.refusedAddr.Add(1)
			d.log.Warn("client address not allowed: closing", "peer", sess.RemoteAddr())
			_ = sess.CloseWithoutExchange()
			continue
		}
		s := &session{peer: peer, exchange: exchangeTCP, traffic: &sessionTraffic{maxRead: d.cfg.MaxReadLen},
			closeExchange: func() { _ = sess.CloseWithoutExchange() }}
		if !d.reg.admit(s) {
			d.refusedBusy.Add(1)
			d.log.Warn("too many sessions: refusing client (server busy)", "peer", sess.RemoteAddr(),
				"max", d.cfg.MaxSessions, "max_per_source", d.cfg.MaxSessionsPerSource)
			d.refuse(sess, oob.ExtBusy)
			continue
		}
		d.runSession(s, "perftest session", sess.RemoteAddr(), func(ctx context.Context) error {
			return d.perftestSession(ctx, sess, s)
		})
	}
}

// runSession runs one admitted session (TCP exchange or rdma_cm) on a
// goroutine of its own under the daemon's session context, and counts and
// logs its end as what ("perftest session failed" / "... complete"). The
// slot is free before the session counts as over. Its clock (setup and
// duration, metrics.go) starts here, as the client is accepted.
func (d *Daemon) runSession(s *session, what string, peer any, run func(context.Context) error) {
	s.start = d.cfg.Now()
	var sctx context.Context
	sctx, s.cancel = context.WithCancelCause(d.sessCtx)
	d.wg.Add(1)
	d.active.Add(1)
	d.total.Add(1)
	go func() {
		defer d.wg.Done()
		err := run(sctx)
		if c := context.Cause(sctx); err != nil && c != nil && c != context.Canceled {
			err = c
		}
		s.cancel(nil)
		d.reg.release(s)
		d.active.Add(-1)
		d.observeEnd(s, err != nil)
		if err != nil {
			d.failed.Add(1)
			d.log.Warn(what+" failed", "peer", peer, "err", err)
			return
		}
		d.completed.Add(1)
		d.log.Debug(what+" complete", "peer", peer)
	}()
}

// refuse tells a client it is not served (an rxed client reads st, a
// perftest client sees the connection closed) without holding the accept
// loop: a bounded number of refusals run at once, each within the
// handshake timeout, and beyond that the connection is just closed.
// Called by the accept loop only, so the Add comes before shutdown's
// Wait on refusals.
func (d *Daemon) refuse(sess *oob.Session, st oob.ExtStatus) {
	select {
	case d.refusing <- struct{}{}:
	default:
		_ = sess.CloseWithoutExchange()
		return
	}
	d.refusals.Add(1)
	go func() {
		defer d.refusals.Done()
		defer func() { <-d.refusing }()
		if d.refused != nil {
			defer d.refused()
		}
		ctx, cancel := context.WithTimeout(d.sessCtx, min(d.cfg.HandshakeTimeout, 2*time.Second))
		defer cancel()
		_ = sess.Refuse(ctx, st)
	}()
}

// reapLoop ends idle sessions: it looks a few times per idle timeout,
// on Config.Ticker's ticks if set, until sessCtx ends; shutdown waits for
// it (reapDone).
func (d *Daemon) reapLoop() {
	defer close(d.reapDone)
	tick, stop := d.ticker(max(d.cfg.IdleTimeout/4, 10*time.Millisecond))
	defer stop()
	for {
		select {
		case <-d.sessCtx.Done():
			return
		case <-tick:
			d.reapIdle(d.cfg.Now())
		}
	}
}

// ticker ticks every d: Config.Ticker's when set (tests drive it),
// else a real one; stop stops it.
func (d *Daemon) ticker(every time.Duration) (tick <-chan time.Time, stop func()) {
	if d.cfg.Ticker != nil {
		return d.cfg.Ticker(every)
	}
	t := time.NewTicker(every)
	return t.C, t.Stop
}

// reapIdle ends the sessions idle at now and returns how many.
func (d *Daemon) reapIdle(now time.Time) int {
	idle := d.reg.idle(now, d.cfg.IdleTimeout)
	for _, s := range idle {
		d.reclaimed.Add(1)
		// Cancelled and closed before it is logged: the session's
		// goroutine notices its context when it is scheduled, and in the
		// meantime it could still read and answer its client's next
		// message (a loaded host, CI's TestServeIdleSessionsReclaimed).
		s.cancel(errIdle)
		if s.closeExchange != nil {
			s.closeExchange()
		}
		d.log.Warn("idle session reclaimed", "peer", s.peer, "idle_timeout", d.cfg.IdleTimeout)
	}
	return len(idle)
}

// shutdown is the graceful stop.
func (d *Daemon) shutdown() error {
	d.log.Info("shutting down", "active_sessions", d.active.Load())
	if d.oobLn != nil {
		_ = d.oobLn.Close()
		// The accept loop ends before the sessions are waited for: a
		// client it accepted as the listener closed is admitted with
		// wg.Add, which must not run beside the Wait below, and its
		// session gets the grace period as the others do.
		if d.awaitingAcceptLoop != nil {
			d.awaitingAcceptLoop()
		}
		<-d.acceptDone
	}
	d.closeRDMACM() // waits for its accept loop too
	// Running sessions get the grace period, then their context ends.
	done := make(chan struct{})
	go func() { d.wg.Wait(); close(done) }()
	if !d.graceWait(done) {
		d.log.Warn("grace period over: aborting sessions", "active", d.active.Load())
	}
	d.sessCancel()
	<-d.acceptDone
	<-done // every session over (and the goroutine above gone)
	// The reaper and the refusals end with sessCtx: wait, so that no
	// goroutine of the daemon outlives Run (TestRunLeavesNoGoroutine).
	if d.reapDone != nil {
		if d.awaitingReaper != nil {
			d.awaitingReaper()
		}
		<-d.reapDone
	}
	if d.awaitingRefusals != nil {
		d.awaitingRefusals()
	}
	d.refusals.Wait()
	if d.http != nil {
		wait := d.httpShutdown
		if wait == 0 {
			wait = 2 * time.Second
		}
		sctx, cancel := context.WithTimeout(context.Background(), wait)
		if d.http.Shutdown(sctx) != nil {
			// Requests still running: their connections go, and
			// release waits for any gather still reading the device
			// (scrapes.go).
			_ = d.http.Close()
		}
		cancel()
	}
	<-d.metricsDone
	err := d.release()
	if err == nil {
		d.log.Info("stopped")
	}
	return err
}

// graceWait waits up to ShutdownGrace for the sessions to end (done), on
// the daemon's clock: Config.Ticker's first tick (every: the grace), a
// real ticker without one, so that a test drives the grace instead of
// sitting it out (it was a time.Timer whatever the Config). It reports
// whether they ended in time; with no grace (negative) they have not
// unless already over.
func (d *Daemon) graceWait(done <-chan struct{}) bool {
	select {
	case <-done:
		return true // nothing to wait for: no ticker
	default:
	}
	if d.cfg.ShutdownGrace <= 0 {
		return false
	}
	tick, stop := d.ticker(d.cfg.ShutdownGrace)
	defer stop()
	select {
	case <-done:
		return true
	case <-tick:
		return false
	}
}

// release stops the engine, then persists and unmaps every export.
func (d *Daemon) release() error {
	var first error
	d.stopOnce.Do(func() {
		if d.sessCancel != nil {
			d.sessCancel()
		}
		if d.oobLn != nil {
			_ = d.oobLn.Close()
		}
		if d.metricsLn != nil {
			_ = d.metricsLn.Close()
		}
		d.endScrapes() // no gather reads the device from here on
		if d.dev != nil {
			_ = d.dev.Close()
		}
		for _, e := range d.exports {
			if err := e.Mapping.Sync(); err != nil && first == nil {
				first = fmt.Errorf("export %s: msync: %v", e.Spec.Name, err)
			}
			if e.MR != nil {
				_ = e.MR.Dereg()
			}
			if err := e.Mapping.Close(); err != nil && first == nil {
				first = fmt.Errorf("export %s: unmap: %v", e.Spec.Name, err)
			}
		}
	})
	return first
}
