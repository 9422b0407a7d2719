package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/rdmacm"
)

// cmServe is the daemon's rdma_cm listener state (rdmacm_serve.go).
type cmServe struct {
	ln      cmListener    // *rdmacm.Listener (backoff.go)
	done    chan struct{} // closed when the accept loop has returned
	waiters cmWaiters
}

// cmTestQP is one test QP of an rdma_cm session with its connection.
type cmTestQP struct {
	*perftestQP
	conn      *rdmacm.Conn
	gid       netip.Addr // the peer's, from the connection
	remoteQPN uint32
	st        *sessionTraffic // the session's accounting
}

// rdmaCMSession plays the server of ib_write_bw / ib_read_bw /
// ib_atomic_bw -R (the same exchange for all three, as over TCP):
// the control connection of req, the negotiation, the client's test
// connections until its second hand shake, the keys and barriers, then
// it idles until the client's report (rdmacm_ctrl.go's sequence).
func (d *Daemon) rdmaCMSession(ctx context.Context, req *rdmacm.Request, s *session) (err error) {
	_, remote := cmPeer(req, req.Remote)
	log := d.log.With("peer", remote.String(), "exchange", "rdma_cm")
	hctx, hcancel := context.WithTimeout(ctx, d.cfg.HandshakeTimeout)
	defer hcancel()
	defer func() {
		if err != nil && ctx.Err() == nil && errors.Is(hctx.Err(), context.DeadlineExceeded) {
			d.hsTimeouts.Add(1)
			err = fmt.Errorf("handshake timed out after %v: %w", d.cfg.HandshakeTimeout, err)
		}
	}()
	ctrl, err := NewCMControl(d.dev, d.pd, CMControlConfig{Role: oob.Server, Timeout: d.cfg.StepTimeout, GIDIndex: d.cfg.GIDIndex})
	if err != nil {
		_ = req.Reject(nil)
		return err
	}
	cq, err := d.dev.CreateCQ(16)
	if err != nil {
		ctrl.Close()
		_ = req.Reject(nil)
		return err
	}
	var qps []*cmTestQP
	defer func() { d.endCMSession(log, ctrl, qps, cq, err == nil) }()
	p := &rdmacm.ConnParam{RetryCount: 7, RNRRetryCount: 7, ACKTimeout: d.cfg.QPTimeout}
	conn, err := req.Accept(hctx, ctrl.QP(), p)
	if err != nil {
		return fmt.Errorf("accepting the control connection: %w", err)
	}
	ctrl.Attach(conn)
	st := s.traffic
	if d.cfg.SessionBytes > 0 {
		st.txLimit.Store(d.cfg.SessionBytes)
	}
	mtu := d.cfg.MTU
	if mtu == 0 {
		pa, _ := d.dev.QueryPort(1)
		mtu = int(pa.ActiveMTU)
	}
	neg, err := ctrl.Negotiate(hctx, mtu)
	if err != nil {
		return err
	}
	// The client connects its test QPs as soon as we answer its first
	// hand shake: wait for them from then on, not before, so that the
	// window in which a request from the address is taken for a test
	// connection is as short as it can be (cmWaiters). The answer waits
	// while another session of the address waits for its own.
	var waiter chan *rdmacm.Request
	defer func() {
		if waiter != nil {
			d.cm.waiters.end(s.peer, waiter, rejectTestConn) // on every return: errors too
		}
	}()
	if _, err := ctrl.handShakeThen(hctx, oob.Key{}, true, func() error {
		var err error
		waiter, err = d.cm.waiters.open(hctx, s.peer, conn.Done(), func() {
			log.Debug("rdma_cm session waits for another session of its address to connect its test QPs")
		})
		if err != nil {
			return fmt.Errorf("waiting for another session of %s to connect its test QPs: %w", s.peer, err)
		}
		return nil
	}); err != nil {
		return err
	}
	if qps, err = d.acceptTestConns(hctx, ctrl, cq, waiter, s, qps); err != nil {
		return err
	}
	d.cm.waiters.end(s.peer, waiter, rejectTestConn) // raced with the hand shake: too late
	for i, q := range qps {
		k, err := ctrl.HandShake(hctx, q.key, true)
		if err != nil {
			return err
		}
		if i == 0 && k.RKey == 0 && k.VAddr == 0 {
			return errors.New("the client runs a send test (its key has no buffer address); serve answers ib_write_bw, ib_read_bw and ib_atomic_bw clients (use rxed perf send for send tests)")
		}
	}
	t := oob.Test{Verb: oob.VerbWrite} // write, read and atomic bw make the same exchange
	for range t.Barriers() {
		if _, err := ctrl.HandShake(hctx, qps[0].key, true); err != nil {
			return err
		}
	}
	log.Info("perftest client connected", "version", neg.RemoteVersion, "qps", len(qps), "mtu", oob.MTUBytes(neg.MTU),
		"export", d.target.Spec.Name, "gid", qps[0].gid)
	hcancel()
	d.established(s)
	rep, err := ctrl.Finish(ctx, t, qps[0].key, oob.BWReport{})
	if err != nil {
		return err
	}
	log.Info("perftest client done", "size", rep.Size, "iterations", rep.Iters,
		"bw_avg_MBps", fmt.Sprintf("%.2f", rep.BWAvg), "msg_rate_Mpps", fmt.Sprintf("%.6f", rep.MsgRateAvg),
		"sent_bytes", st.txBytes.Load(), "dropped_by_budget", st.drops.Load())
	if err := d.target.Mapping.Sync(); err != nil {
		log.Warn("msync after session failed", "export", d.target.Spec.Name, "err", err)
	}
	return nil
}

// acceptTestConns accepts the client's test connections (one per QP)
// until its second hand shake arrives on the control connection.
func (d *Daemon) acceptTestConns(ctx context.Context, ctrl *CMControl, cq *ib.CQ, waiter chan *rdmacm.Request,
	s *session, qps []*cmTestQP) ([]*cmTestQP, error) {
	type shake struct{ err error }
	hs := make(chan shake, 1)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, err := ctrl.HandShake(sctx, oob.Key{}, true)
		hs <- shake{err}
	}()
	for {
		select {
		case r := <-hs:
			if r.err != nil {
				return qps, r.err
			}
			if len(qps) == 0 {
				return qps, errors.New("the client connected no test QP")
			}
			return qps, nil
		case req := <-waiter:
			if len(qps) == maxPerftestQPs {
				_ = req.Reject(nil)
				cancel()
				<-hs
				return qps, fmt.Errorf("client offered more than %d QPs", maxPerftestQPs)
			}
			q, err := d.acceptTestConn(ctx, req, cq, s)
			if err != nil {
				cancel()
				<-hs
				return qps, err
			}
			qps = append(qps, q)
		}
	}
}

// acceptTestConn accepts one test connection with a fresh QP, clamping
// the READ/atomic depths to what the client offered (as perftest's
// server), and routes its traffic to the session's accounting.
func (d *Daemon) acceptTestConn(ctx context.Context, req *rdmacm.Request, cq *ib.CQ, s *session) (*cmTestQP, error) {
	pq, err := d.newPerftestQP(cq)
	if err != nil {
		_ = req.Reject(nil)
		return nil, err
	}
	q := &cmTestQP{perftestQP: pq, st: s.traffic}
	// Accounted from before the REP: the client may send its first
	// request as soon as the REP arrives, before our Accept returns.
	q.gid, q.remoteQPN = req.RemoteQP()
	if err := d.traffic.track(q.st, q.qp.Num(), q.gid, q.remoteQPN); err != nil {
		_ = req.Reject(nil)
		_ = q.qp.Destroy()
		return nil, err
	}
	p := &rdmacm.ConnParam{RetryCount: 7, RNRRetryCount: 7, ACKTimeout: d.cfg.QPTimeout,
		ResponderResources: min(128, max(req.InitiatorDepth, 1)), InitiatorDepth: min(128, max(req.ResponderResources, 1))}
	conn, err := req.Accept(ctx, q.qp, p)
	if err != nil {
		d.retireQP(q.qp, q.st, q.gid, q.remoteQPN)
		return nil, fmt.Errorf("accepting a test connection: %w", err)
	}
	q.conn = conn
	return q, nil
}

// cmEndGrace bounds how long a session's end waits for the client's
// DREQs before disconnecting what is left itself.
const cmEndGrace = 2 * time.Second

// endCMSession ends the session's connections so that, after a completed
// run (finished), the client is the active side of every DREQ, as
// perftest's client is of its test connections (../shared/pcaps:
// rdmacm_*_R.pcap, the client's DREQ comes first): it waits, up to
// cmEndGrace on the daemon's clock, for the client's DREQ on each test
// connection and then on the control one, disconnects only what is still
// up, and frees the session's QPs. After a failed session only the test
// connections get that grace (the client may be waiting for us).
//
// Why the control connection too: a client on rxed's CM (rxed perf -R)
// ends its CM with its process, so its device close lingers for a
// connection that answered our DREQ, through its timewait (a peer whose
// DREP got lost retries), while one whose own DREQ was answered owes
// nothing and closes at once. A session that disconnected the control
// connection as soon as the test ones were gone beat or crossed the
// client's DREQ, and every such client exited a timewait (2 s) late
// (TestRDMACMClientExitsWithoutTimewait). The daemon, which answers the
// DREQs, is the side that sits out timewait: it lingers only when its
// device closes.
func (d *Daemon) endCMSession(log *slog.Logger, ctrl *CMControl, qps []*cmTestQP, cq *ib.CQ, finished bool) {
	var waits []<-chan struct{}
	for _, q := range qps {
		waits = append(waits, q.conn.Done())
	}
	if c := ctrl.Conn(); c != nil && finished {
		waits = append(waits, c.Done())
	}
	var dctx context.Context
	if allClosed(waits) {
		// Nothing to wait for, and no ticker started for it; what is
		// left (a failed session's control connection) waits as long
		// for its DREP.
		var cancel context.CancelFunc
		dctx, cancel = context.WithTimeout(context.Background(), cmEndGrace)
		defer cancel()
	} else {
		var cancel func()
		dctx, cancel = d.graceContext(cmEndGrace)
		defer cancel()
		for i, w := range waits {
			if i == len(qps) && !allClosed(waits[i:]) {
				log.Debug("rdma_cm session waits for the client to disconnect the control connection")
			}
			select {
			case <-w:
			case <-dctx.Done():
			}
		}
	}
	// The rest waits for the DREPs within what is left of the same bound.
	for _, q := range qps {
		_ = q.conn.Disconnect(dctx)
	}
	if c := ctrl.Conn(); c != nil {
		_ = c.Disconnect(dctx)
	}
	for _, q := range qps {
		d.retireQP(q.qp, q.st, q.gid, q.remoteQPN)
	}
	ctrl.Close()
	_ = cq.Destroy()
}

// allClosed reports whether every channel of chs is closed.
func allClosed(chs []<-chan struct{}) bool {
	for _, c := range chs {
		select {
		case <-c:
		default:
			return false
		}
	}
	return true
}

// graceContext returns a context that ends grace from now on the daemon's
// clock (Config.Ticker's first tick, so that a test drives it; a real
// ticker without one), or when cancel is called. cancel joins the
// goroutine that waits for the tick.
func (d *Daemon) graceContext(grace time.Duration) (ctx context.Context, cancel func()) {
	ctx, stopCtx := context.WithCancel(context.Background())
	tick, stop := d.ticker(grace)
	joined := make(chan struct{})
	go func() {
		defer close(joined)
		defer stop()
		select {
		case <-tick:
			stopCtx()
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		stopCtx()
		<-joined
	}
}
