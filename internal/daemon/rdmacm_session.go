package daemon

import (
	"context"
	"errors"
	"fmt"
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
	defer func() { d.endCMSession(ctrl, qps, cq) }()
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

// endCMSession disconnects the test connections (after giving the client
// a moment to do it, as perftest's client does first) and the control
// connection, and frees the session's QPs.
func (d *Daemon) endCMSession(ctrl *CMControl, qps []*cmTestQP, cq *ib.CQ) {
	dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, q := range qps {
		select {
		case <-q.conn.Done():
		case <-dctx.Done():
		}
	}
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
