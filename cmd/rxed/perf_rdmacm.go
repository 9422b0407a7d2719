package main

// rxed perf -R: perftest's rdma_cm mode. There is no TCP: the exchange
// runs over a control connection made with rdma_cm (internal/daemon's
// CMControl, which documents the sequence as captured), the test QPs are
// connected by rdma_cm on the same port, and the run, its figures and
// its output are the TCP mode's (perf_run.go).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/rxed/rxed/internal/daemon"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/wire/mad"
)

// perfFinisher ends a run: *oob.Session over TCP, *daemon.CMControl over
// rdma_cm.
type perfFinisher interface {
	Finish(ctx context.Context, t oob.Test, local oob.Key, my oob.BWReport) (oob.BWReport, error)
}

// perfCMWaiting is what perftest's server prints under its banner while
// it waits for the test connections.
const perfCMWaiting = " Waiting for client rdma_cm QP to connect\n Please run the same command with the IB/RoCE interface IP\n"

// perftest's client retries a refused connect of its test QPs (the
// server may not listen yet): rdma_cm_client_connection's 10 tries
// 100 ms apart. Nothing tells a client when perftest's server listens:
// it closes its listener once the control connection is up
// (rdma_server_connect's rdma_destroy_id) and listens again only after
// answering the hand shake before the test connections
// (create_rdma_cm_connection), an all-zero key like the client's
// (frame 22 of ../shared/pcaps/perftest_write_bw_rc_4096_rdmacm.pcap).
// That answer is all perftest's client waits for too; its address and
// route resolution and its test resources (3-6 ms after the answer in
// the captures) usually, not always, let the server listen first
// (perftest issue #93), and a quicker client meets REJ 8 and retries.
// rxed's server and rxed serve listen before they answer.
const (
	perfCMDialTries = 10
	perfCMDialDelay = 100 * time.Millisecond
)

// perfCM is one side of a -R run: the control connection and the test
// connections, in the order they were made.
type perfCM struct {
	r     *perfRun
	ctrl  *daemon.CMControl
	ln    *rdmacm.Listener
	conns []*rdmacm.Conn
}

// rdmaCMSession runs everything after setup over rdma_cm.
func (r *perfRun) rdmaCMSession(ctx context.Context) (err error) {
	o := r.o
	role := oob.Client
	if r.server() {
		role = oob.Server
	}
	// KeepAlive: a server idles on the control connection through the
	// client's run, with no bound of its own; probing it every --timeout
	// ends the server when its client vanished without a DREQ (SIGKILL,
	// host lost), where it waited for ever.
	ctrl, err := daemon.NewCMControl(r.en.dev, r.pd, daemon.CMControlConfig{Role: role, Timeout: o.ef.timeout,
		GIDIndex: o.gidx, DontXchgVersions: o.noVersions, KeepAlive: o.ef.timeout, Log: o.ef.logger(r.stderr), Test: &o.test})
	if err != nil {
		return err
	}
	s := &perfCM{r: r, ctrl: ctrl}
	defer func() {
		if derr := s.teardown(); err == nil {
			err = derr
		}
	}()
	if err := s.connectControl(ctx); err != nil {
		return err
	}
	neg, err := ctrl.Negotiate(ctx, r.localMTU())
	if err != nil {
		return err
	}
	r.mtu = neg.MTU
	ti := r.testInfo()
	ti.RDMACM = true
	if err := oob.WriteTestInfo(r.stdout, ti); err != nil {
		return err
	}
	if r.server() {
		_, _ = io.WriteString(r.stdout, perfCMWaiting+oob.ResultLine)
	}
	// perftest's create_rdma_cm_connection: a hand shake, the test
	// connections, another hand shake (both all-zero keys).
	if _, err := ctrl.HandShake(ctx, oob.Key{}, true); err != nil {
		return err
	}
	if err := s.connectTestQPs(ctx); err != nil {
		return err
	}
	if _, err := ctrl.HandShake(ctx, oob.Key{}, true); err != nil {
		return err
	}
	locals := make([]oob.Key, len(r.qps))
	for i, q := range r.qps {
		locals[i] = r.key(q)
		// perftest prints the addresses of an rdma_cm run with its control
		// connection's verb, SEND: no OUT, RKey or VAddr.
		_ = oob.WriteAddress(r.stdout, false, oob.VerbSend, locals[i], true)
	}
	r.peer = true
	for i, q := range r.qps {
		rk, err := ctrl.HandShake(ctx, locals[i], true)
		if err != nil {
			return err
		}
		q.remote = rk
		if rk.SRQN != perfMarker {
			r.peer = false
		}
		_ = oob.WriteAddress(r.stdout, true, oob.VerbSend, rk, true)
	}
	for range o.test.Barriers() {
		if _, err := ctrl.HandShake(ctx, locals[0], true); err != nil {
			return err
		}
	}
	if o.test.Latency {
		_ = oob.WriteLatencyHeader(r.stdout, false)
	} else {
		_ = oob.WriteBWHeader(r.stdout, o.gbits)
	}
	closed := false
	return r.run(ctx, ctrl, locals[0], &closed)
}

// cmParamsFor is what perftest passes to rdma_connect and rdma_accept:
// retry 7, RNR retry 7, --qp-timeout as RDMA_OPTION_ID_ACK_TIMEOUT, for
// the test QPs -T as RDMA_OPTION_ID_TOS (the control connection's comm
// params have DEF_TOS), and for the test QPs of read and atomic tests -o
// both ways.
func (s *perfCM) cmParamsFor(testQP bool) cmParams {
	o := s.r.o
	gid, _ := o.ef.gid("-x", o.gidx)
	p := cmParams{local: gid, retryCount: 7, rnrRetryCount: 7, ackTimeout: uint8(o.qpTimeout), timeout: o.ef.timeout}
	if testQP {
		p.tos = o.tos.v
	}
	if testQP && (o.test.Verb == oob.VerbRead || o.test.Verb == oob.VerbAtomic) {
		p.respResources, p.initiatorDepth = uint8(o.outReads), uint8(o.outReads)
	}
	return p
}

// connectControl makes the control connection: the server listens on -p
// (every address, as perftest binds INADDR_ANY) and accepts one request;
// the client dials the server.
func (s *perfCM) connectControl(ctx context.Context) error {
	r, o := s.r, s.r.o
	p := s.cmParamsFor(false)
	if !r.server() {
		raddr, err := s.serverAddr()
		if err != nil {
			return err
		}
		c, err := cmDial(ctx, s.ctrl.QP(), raddr, p)
		if err != nil {
			return connectError(raddr, err, o.ef.timeout, "the server running there with -R")
		}
		s.ctrl.Attach(c.c)
		return nil
	}
	any := netip.IPv4Unspecified()
	if p.local.Is6() && !p.local.Is4In6() {
		any = netip.IPv6Unspecified()
	}
	ln, err := rdmacm.Listen(r.en.dev, netip.AddrPortFrom(any, uint16(o.ef.oobPort)), nil)
	if err != nil {
		return fmt.Errorf("rdma_cm listen on port %d: %v", o.ef.oobPort, err)
	}
	s.ln = ln
	if err := oob.WriteWaitingForClient(r.stdout); err != nil {
		return err
	}
	actx, cancel := withWait(ctx, o.wait)
	defer cancel()
	req, err := ln.Accept(actx)
	if err = waitErr(actx, err); err != nil {
		return err
	}
	c, err := req.Accept(ctx, s.ctrl.QP(), connParam(p))
	if err != nil {
		return fmt.Errorf("accepting the control connection of %s: %w", req.Remote, cmError(err))
	}
	s.ctrl.Attach(c)
	return nil
}

// serverAddr is the client's target: the server's IP and -p.
func (s *perfCM) serverAddr() (netip.AddrPort, error) {
	ip, err := parseHost("server", s.r.o.server)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%v (-R connects by IP address)", err)
	}
	return netip.AddrPortFrom(ip, uint16(s.r.o.ef.oobPort)), nil
}

// connectTestQPs connects every test QP with rdma_cm, in order, on the
// control connection's port. A send test's receives are posted first.
func (s *perfCM) connectTestQPs(ctx context.Context) error {
	r, o := s.r, s.r.o
	p := s.cmParamsFor(true)
	var raddr netip.AddrPort
	if !r.server() {
		raddr, _ = s.serverAddr()
	}
	for _, q := range r.qps {
		if o.test.Verb == oob.VerbSend {
			for slot := range r.slots {
				if err := r.postRecv(q, slot); err != nil {
					return err
				}
			}
		}
		var c *rdmacm.Conn
		var err error
		if r.server() {
			c, err = s.acceptTest(ctx, q, p)
		} else {
			c, err = s.dialTest(ctx, q, raddr, p)
		}
		if err != nil {
			return err
		}
		s.conns = append(s.conns, c)
	}
	return nil
}

// acceptTest accepts the next test connection for q: perftest's server
// clamps its responder resources to the client's initiator depth and its
// initiator depth to the client's responder resources.
func (s *perfCM) acceptTest(ctx context.Context, q *perfQP, p cmParams) (*rdmacm.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, s.r.o.ef.timeout)
	defer cancel()
	req, err := s.ln.Accept(actx)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, fmt.Errorf("the client connected no test QP within --timeout %v", s.r.o.ef.timeout)
		}
		return nil, err
	}
	if want := s.ctrl.Conn().RemoteAddr().Addr(); req.Remote.Addr() != want {
		_ = req.Reject(nil)
		return nil, fmt.Errorf("a test connection from %s, not from the client %s", req.Remote.Addr(), want)
	}
	if p.respResources > 0 {
		p.respResources = min(p.respResources, max(req.InitiatorDepth, 1))
		p.initiatorDepth = min(p.initiatorDepth, max(req.ResponderResources, 1))
	}
	c, err := req.Accept(ctx, q.qp, connParam(p))
	if err != nil {
		return nil, fmt.Errorf("accepting the test connection of %s: %w", req.Remote, cmError(err))
	}
	return c, nil
}

// dialTest connects q to the server, retrying while nobody listens yet.
func (s *perfCM) dialTest(ctx context.Context, q *perfQP, raddr netip.AddrPort, p cmParams) (*rdmacm.Conn, error) {
	for try := 1; ; try++ {
		c, err := cmDial(ctx, q.qp, raddr, p)
		if err == nil {
			return c.c, nil
		}
		var rej *rdmacm.RejectError
		st := q.qp.State()
		if try >= perfCMDialTries || !errors.As(err, &rej) || rej.Reason != mad.REJInvalidServiceID || (st != ib.QPSReset && st != ib.QPSInit) {
			return nil, fmt.Errorf("test QP: %w", connectError(raddr, err, s.r.o.ef.timeout, ""))
		}
		select {
		case <-time.After(perfCMDialDelay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// teardown ends the connections (endPerfConns: the client disconnects
// every one, the server waits for that and disconnects what is left),
// then closes the listener and the control QP's resources.
func (s *perfCM) teardown() error {
	endPerfConns(s.r.server(), s.conns, s.ctrl.Conn(), min(s.r.o.ef.timeout, 5*time.Second))
	if s.ln != nil {
		_ = s.ln.Close()
	}
	s.ctrl.Close()
	return nil
}
