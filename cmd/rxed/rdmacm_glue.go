package main

// The tools' only calls into pkg/rdmacm: listen, accept (RC or SIDR),
// reject, dial (RC or SIDR), and the connection's end. Everything the
// tools do on the wire besides connection management is their own.

import (
	"context"
	"errors"
	"net/netip"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/wire/mad"
)

// cmListener listens for rdma_cm requests on one address and port.
type cmListener struct{ l *rdmacm.Listener }

// cmListen listens on addr in the TCP port space, or with ud in the UDP
// one (SIDR).
func cmListen(dev *ib.Device, addr netip.AddrPort, ud bool) (*cmListener, error) {
	opts := &rdmacm.ListenOptions{}
	if ud {
		opts.PortSpace = mad.PortSpaceUDP
	}
	l, err := rdmacm.Listen(dev, addr, opts)
	if err != nil {
		return nil, err
	}
	return &cmListener{l: l}, nil
}

func (l *cmListener) accept(ctx context.Context) (*cmRequest, error) {
	r, err := l.l.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return &cmRequest{r: r}, nil
}

func (l *cmListener) close() error { return l.l.Close() }

// cmRequest is one connection request (RDMA_CM_EVENT_CONNECT_REQUEST).
type cmRequest struct{ r *rdmacm.Request }

func (r *cmRequest) remote() netip.AddrPort { return r.r.Remote }
func (r *cmRequest) isUD() bool             { return r.r.UD() }

// accept connects q (in INIT, its receives posted) and returns once the
// connection is established.
func (r *cmRequest) accept(ctx context.Context, q *ib.QP, p cmParams) (*cmConn, error) {
	c, err := r.r.Accept(ctx, q, connParam(p))
	if err != nil {
		return nil, err
	}
	return &cmConn{c: c}, nil
}

// acceptUD answers a SIDR request with q (UD, in RTS) and rdma_cm's Q_Key.
func (r *cmRequest) acceptUD(q *ib.QP) error { return r.r.AcceptUD(q, rdmaUDPQKey, nil) }

func (r *cmRequest) reject() error { return r.r.Reject(nil) }

// cmConn is an established connection.
type cmConn struct{ c *rdmacm.Conn }

func (c *cmConn) done() <-chan struct{}                { return c.c.Done() }
func (c *cmConn) disconnect(ctx context.Context) error { return c.c.Disconnect(ctx) }

// cmDial connects q (RC, in INIT, its receives posted) to raddr.
func cmDial(ctx context.Context, q *ib.QP, raddr netip.AddrPort, p cmParams) (*cmConn, error) {
	c, err := rdmacm.Dial(ctx, q, raddr, connParam(p))
	if err != nil {
		return nil, err
	}
	return &cmConn{c: c}, nil
}

// udRemote is a resolved UD service: where to send datagrams, and the
// traffic class and hop limit of the address handle to send them with
// (rdma_cm's ud_param.ah_attr: the dialer's ConnParam.TOS and route).
type udRemote struct {
	gid                    netip.Addr
	qpn, qkey              uint32
	trafficClass, hopLimit uint8
}

// av is the address handle's path to the service from local, on this
// engine's UDP port (ibv_create_ah on RDMA_CM_EVENT_ESTABLISHED's
// ah_attr).
func (u udRemote) av(dev *ib.Device, local netip.Addr) ib.AddrVector {
	av := udAV(dev, local, u.gid)
	av.TrafficClass, av.HopLimit = u.trafficClass, u.hopLimit
	return av
}

// cmDialUD resolves the UD service at raddr by SIDR.
func cmDialUD(ctx context.Context, dev *ib.Device, raddr netip.AddrPort, p cmParams) (udRemote, error) {
	cp := connParam(p)
	cp.PortSpace = mad.PortSpaceUDP
	u, err := rdmacm.DialUD(ctx, dev, raddr, cp)
	if err != nil {
		return udRemote{}, err
	}
	return udRemote{gid: u.GID, qpn: u.QPN, qkey: u.QKey, trafficClass: u.TrafficClass, hopLimit: u.HopLimit}, nil
}

func connParam(p cmParams) *rdmacm.ConnParam {
	return &rdmacm.ConnParam{Local: p.local, ResponderResources: p.respResources, InitiatorDepth: p.initiatorDepth,
		RetryCount: p.retryCount, RNRRetryCount: p.rnrRetryCount, ACKTimeout: p.ackTimeout, TOS: p.tos, Timeout: p.timeout}
}

// errNoAnswer is rdmacm.ErrTimeout without the package's prefix.
var errNoAnswer = errors.New("no answer from the peer (CM timeout)")

// cmError is the part of a connect error worth a line: the REJ's reason
// ("rejected: invalid service ID (8)"), the SIDR status, or the CM's
// timeout, without the package's wrapping (the tool names the peer).
func cmError(err error) error {
	var rej *rdmacm.RejectError
	if errors.As(err, &rej) {
		return rej
	}
	var sidr *rdmacm.SIDRError
	if errors.As(err, &sidr) {
		return sidr
	}
	if errors.Is(err, rdmacm.ErrTimeout) {
		return errNoAnswer
	}
	return err
}
