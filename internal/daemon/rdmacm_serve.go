package daemon

// rxed serve's rdma_cm listener (Config.RDMACMPort, --rdma-cm-port):
// ib_write_bw / ib_read_bw / ib_atomic_bw clients run with -R connect
// here instead of the TCP exchange. One listener takes every request on
// the port: a request from an address that has a session waiting for its
// test connections goes to that session (one at a time per address:
// cmWaiters); any other request opens a new session, under the
// same rules as the TCP exchange (the allowlist, the global and
// per-source limits, the handshake and idle timeouts, the READ cap and
// the session byte budget). The peer's address is the CM's (the address
// the REQ came from, which got our REP and answered it), not the one
// rdma_cm's header names (cmPeer), so no address proof is needed, and
// token mode has no rdma_cm counterpart (New refuses the combination).

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/rdmacm"
)

// DefaultRDMACMPort is perftest's port; serve's rdma_cm listener is off
// unless a port is given.
const DefaultRDMACMPort = oob.DefaultPort

// cmWaiters holds, per peer address, the one session waiting for its
// client's test connections (its window: from its answer to the client's
// first hand shake to the second).
//
// Why one: a test connection's REQ names nothing that ties it to a
// control connection (perftest's REQs are alike, rdma_cm's header has a
// fresh source port per ID, and two clients on one host share its
// address and CA GUID; see perftest_write_bw_rc_4096_rdmacm.pcap frames 1
// and 24), so the address is all there is to route it by. With two
// sessions of one address waiting at once, a test QP of the one could be
// connected to the other. A session opens its window only when no other
// of its address has one, and its client connects its test QPs only after
// that (perftest dials them once the first hand shake is answered), so
// every test REQ from the address in the window is its client's; a new
// client's control REQ arriving in that window (a few round trips) is
// still taken for a test connection (docs/tools.md).
//
// Locking: mu guards m; never held across I/O.
type cmWaiters struct {
	mu sync.Mutex
	m  map[netip.Addr]*cmWindow
}

// cmWindow is one session's window.
type cmWindow struct {
	ch   chan *rdmacm.Request // its test connections
	ctrl <-chan struct{}      // closed once its control connection has ended
	free chan struct{}        // closed when the window closes (end)
}

// open opens peer's window for a session whose control connection ends
// with ctrl, waiting while another session of peer has it open (wait is
// called first, once, if it must); it returns the channel of the
// session's test connections, or ctx's error.
func (w *cmWaiters) open(ctx context.Context, peer netip.Addr, ctrl <-chan struct{}, wait func()) (chan *rdmacm.Request, error) {
	for {
		w.mu.Lock()
		if w.m == nil {
			w.m = map[netip.Addr]*cmWindow{}
		}
		cur := w.m[peer]
		if cur == nil {
			ch := make(chan *rdmacm.Request, maxPerftestQPs)
			w.m[peer] = &cmWindow{ch: ch, ctrl: ctrl, free: make(chan struct{})}
			w.mu.Unlock()
			return ch, nil
		}
		w.mu.Unlock()
		if wait != nil {
			wait()
			wait = nil
		}
		select {
		case <-cur.free:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// end closes ch's window (the next session of its address may open
// one) and answers every request still queued in it with reject: after
// that nothing more can land there, and a request left unanswered would
// stay half open in the CM for good, holding one of its MaxHalfOpen
// slots (a client that sent its test REQs and vanished, then a session
// that ended on an error). Ending a window twice does nothing more.
func (w *cmWaiters) end(peer netip.Addr, ch chan *rdmacm.Request, reject func(*rdmacm.Request)) {
	w.mu.Lock()
	if cur := w.m[peer]; cur != nil && cur.ch == ch {
		delete(w.m, peer)
		close(cur.free)
	}
	w.mu.Unlock()
	for {
		select {
		case r := <-ch:
			reject(r)
		default:
			return
		}
	}
}

// rejectTestConn answers a test connection the session will not take.
func rejectTestConn(r *rdmacm.Request) { _ = r.Reject(nil) }

// deliver hands req to the session of peer waiting for test
// connections. It reports false when there is none, when that session
// has all the connections it may take, or when its control connection
// has ended: its client is gone, and req is a new client's (it
// reconnected), not a test connection of the old one.
func (w *cmWaiters) deliver(peer netip.Addr, req *rdmacm.Request) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	cur := w.m[peer]
	if cur == nil {
		return false
	}
	select {
	case <-cur.ctrl:
		return false
	default:
	}
	select {
	case cur.ch <- req:
		return true
	default:
		return false
	}
}

// openRDMACM starts listening on the rdma_cm port (New).
func (d *Daemon) openRDMACM() error {
	if d.cfg.RDMACMPort == 0 {
		return nil
	}
	if len(d.cfg.Token) > 0 {
		return errors.New("--rdma-cm-port: token mode covers the TCP exchange only (perftest -R clients cannot prove a token)")
	}
	if d.target == nil {
		return errors.New("perftest clients need an export to target (give --export)")
	}
	// On ::, as a perftest server's rdma_bind_addr of in6addr_any: it
	// takes version 4 and version 6 rdma_cm headers alike (rdmacm's
	// Listener.takes), so IPv6 clients are served too. 0.0.0.0 took
	// version 4 headers only and refused every IPv6 client with REJ 28.
	ln, err := rdmacm.Listen(d.dev, netip.AddrPortFrom(netip.IPv6Unspecified(), d.cfg.RDMACMPort), nil)
	if err != nil {
		return fmt.Errorf("rdma_cm listener on port %d: %v", d.cfg.RDMACMPort, err)
	}
	d.cm.ln = ln
	d.cm.done = make(chan struct{})
	return nil
}

// startRDMACM runs the accept loop (Run, whose ctx ends its backoff).
func (d *Daemon) startRDMACM(ctx context.Context) {
	if d.cm.ln == nil {
		return
	}
	go d.cmAcceptLoop(ctx)
	d.log.Info("perftest rdma_cm exchange", "port", d.cfg.RDMACMPort, "export", d.target.Spec.Name)
}

// closeRDMACM stops accepting and waits for the accept loop (shutdown).
func (d *Daemon) closeRDMACM() {
	if d.cm.ln == nil {
		return
	}
	_ = d.cm.ln.Close()
	<-d.cm.done
}

// RDMACMAddr is the rdma_cm listener's address (invalid when disabled).
func (d *Daemon) RDMACMAddr() netip.AddrPort {
	if d.cm.ln == nil {
		return netip.AddrPort{}
	}
	return d.cm.ln.Addr()
}

// cmAcceptLoop takes the rdma_cm listener's requests until it closes; a
// failed Accept backs off (backoff.go) until Run's ctx ends. The device
// closed under the daemon (not by its shutdown, which closes the listener
// first and waits for this loop) ends the loop and, through serveFailed,
// Run, which returns the error, as the TCP loop's permanent failure does.
func (d *Daemon) cmAcceptLoop(ctx context.Context) {
	defer close(d.cm.done)
	var backoff acceptBackoff
	for {
		req, err := d.cm.ln.Accept(d.sessCtx)
		if err != nil {
			if errors.Is(err, rdmacm.ErrClosed) || d.sessCtx.Err() != nil || ctx.Err() != nil {
				return
			}
			if errors.Is(err, ib.ErrDeviceClosed) {
				// Closed under the daemon (Device().Close()): nothing
				// can arrive any more, and a retry would fail and log
				// once a second for ever. Run serving on would leave
				// the exchange dead behind a daemon that looks up.
				d.log.Error("rdma_cm exchange: the device has closed: shutting down", "port", d.cfg.RDMACMPort, "err", err)
				d.serveFailed(fmt.Errorf("rdma_cm exchange on port %d: %w", d.cfg.RDMACMPort, err))
				return
			}
			delay := backoff.next()
			d.log.Warn("rdma_cm accept failed", "err", err, "retry_in", delay)
			if !d.wait(ctx, delay) {
				return
			}
			continue
		}
		backoff.reset()
		peer, remote := cmPeer(req, req.Remote)
		if d.cm.waiters.deliver(peer, req) {
			continue
		}
		if !allowed(d.cfg.Allow, peer) {
			d.refusedAddr.Add(1)
			d.log.Warn("client address not allowed: rejecting its rdma_cm request", "peer", remote)
			_ = req.Reject(nil)
			continue
		}
		s := &session{peer: peer, exchange: exchangeRDMACM, traffic: &sessionTraffic{maxRead: d.cfg.MaxReadLen}}
		if !d.reg.admit(s) {
			d.refusedBusy.Add(1)
			d.log.Warn("too many sessions: rejecting rdma_cm client (server busy)", "peer", remote,
				"max", d.cfg.MaxSessions, "max_per_source", d.cfg.MaxSessionsPerSource)
			_ = req.Reject([]byte("server busy"))
			continue
		}
		d.runSession(s, "perftest rdma_cm session", remote, func(ctx context.Context) error {
			return d.rdmaCMSession(ctx, req, s)
		})
	}
}

// cmPeer is the address a request came from, the one the allowlist, the
// per-source limit and the test-connection windows key on, and with the
// rdma_cm port of its header, how logs name the client. The address is
// the REQ's GRH source (RemoteQP's GID), where our REP and the session's
// traffic go: a client that names another in rdma_cm's header (its own
// to write) gets nothing back at it. pkg/rdmacm already refuses such a
// header (rej_src_mismatch); this holds without that check too. header
// is the rdma_cm header's source (Request.Remote), whose port alone is
// used. req is an interface so that a test can hand it a request whose
// GRH and header disagree, which pkg/rdmacm never delivers.
func cmPeer(req cmSource, header netip.AddrPort) (netip.Addr, netip.AddrPort) {
	gid, _ := req.RemoteQP()
	return gid, netip.AddrPortFrom(gid, header.Port())
}

// cmSource is what cmPeer reads of an *rdmacm.Request: where it came
// from.
type cmSource interface {
	RemoteQP() (gid netip.Addr, qpn uint32)
}
