package daemon

// rxed serve's rdma_cm listener (Config.RDMACMPort, --rdma-cm-port):
// ib_write_bw / ib_read_bw / ib_atomic_bw clients run with -R connect
// here instead of the TCP exchange. One listener takes every request on
// the port: a request from an address that has a session waiting for its
// test connections goes to that session (the oldest waiting one, if the
// address has several); any other request opens a new session, under the
// same rules as the TCP exchange (the allowlist, the global and
// per-source limits, the handshake and idle timeouts, the READ cap and
// the session byte budget). The peer's GID is the CM's (the address the
// REQ came from, which got our REP and answered it), so no address proof
// is needed, and token mode has no rdma_cm counterpart (New refuses the
// combination).

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/rdmacm"
)

// DefaultRDMACMPort is perftest's port; serve's rdma_cm listener is off
// unless a port is given.
const DefaultRDMACMPort = oob.DefaultPort

// cmWaiters are the sessions waiting for test connections, by peer
// address, oldest first.
//
// Locking: mu guards m; never held across I/O.
type cmWaiters struct {
	mu sync.Mutex
	m  map[netip.Addr][]chan *rdmacm.Request
}

func (w *cmWaiters) add(peer netip.Addr) chan *rdmacm.Request {
	ch := make(chan *rdmacm.Request, maxPerftestQPs)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[netip.Addr][]chan *rdmacm.Request{}
	}
	w.m[peer] = append(w.m[peer], ch)
	return ch
}

func (w *cmWaiters) remove(peer netip.Addr, ch chan *rdmacm.Request) {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.m[peer]
	for i, c := range l {
		if c == ch {
			l = append(l[:i:i], l[i+1:]...)
			break
		}
	}
	if len(l) == 0 {
		delete(w.m, peer)
	} else {
		w.m[peer] = l
	}
}

// end takes ch out (remove) and answers every request still queued in it
// with reject: after remove nothing more can land there, and a request
// left unanswered would stay half open in the CM for good, holding one
// of its MaxHalfOpen slots (a client that sent its test REQs and
// vanished, then a session that ended on an error).
func (w *cmWaiters) end(peer netip.Addr, ch chan *rdmacm.Request, reject func(*rdmacm.Request)) {
	w.remove(peer, ch)
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

// deliver hands req to peer's oldest waiting session.
func (w *cmWaiters) deliver(peer netip.Addr, req *rdmacm.Request) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range w.m[peer] {
		select {
		case ch <- req:
			return true
		default: // that session has all the connections it may take
		}
	}
	return false
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
	ln, err := rdmacm.Listen(d.dev, netip.AddrPortFrom(netip.IPv4Unspecified(), d.cfg.RDMACMPort), nil)
	if err != nil {
		return fmt.Errorf("rdma_cm listener on port %d: %v", d.cfg.RDMACMPort, err)
	}
	d.cm.ln = ln
	d.cm.done = make(chan struct{})
	return nil
}

// startRDMACM runs the accept loop (Run).
func (d *Daemon) startRDMACM() {
	if d.cm.ln == nil {
		return
	}
	if d.oobLn == nil && d.cfg.IdleTimeout > 0 {
		go d.reapLoop() // the TCP accept loop starts it otherwise
	}
	go d.cmAcceptLoop()
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

func (d *Daemon) cmAcceptLoop() {
	defer close(d.cm.done)
	for {
		req, err := d.cm.ln.Accept(d.sessCtx)
		if err != nil {
			if errors.Is(err, rdmacm.ErrClosed) || d.sessCtx.Err() != nil {
				return
			}
			d.log.Warn("rdma_cm accept failed", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		peer := req.Remote.Addr().Unmap()
		if d.cm.waiters.deliver(peer, req) {
			continue
		}
		if !allowed(d.cfg.Allow, peer) {
			d.refusedAddr.Add(1)
			d.log.Warn("client address not allowed: rejecting its rdma_cm request", "peer", req.Remote)
			_ = req.Reject(nil)
			continue
		}
		s := &session{peer: peer, exchange: exchangeRDMACM, traffic: &sessionTraffic{maxRead: d.cfg.MaxReadLen}}
		if !d.reg.admit(s) {
			d.refusedBusy.Add(1)
			d.log.Warn("too many sessions: rejecting rdma_cm client (server busy)", "peer", req.Remote,
				"max", d.cfg.MaxSessions, "max_per_source", d.cfg.MaxSessionsPerSource)
			_ = req.Reject([]byte("server busy"))
			continue
		}
		d.runSession(s, "perftest rdma_cm session", req.Remote, func(ctx context.Context) error {
			return d.rdmaCMSession(ctx, req, s)
		})
	}
}
