package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/wire/mad"
)

// Dial connects q, an RC or UC QP in RESET or INIT (ib.InitQP; receives
// may be posted there), to the rdma_cm listener at
// raddr (rdma_resolve_addr, rdma_resolve_route and rdma_connect in one):
// it sends the REQ, takes q to RTR and RTS from the REP, sends the RTU,
// and returns the established connection. A refusal is a *RejectError
// (reason 8: nobody listens on the port; 28: the application or rdma_cm
// refused), silence ErrTimeout after the CM's retries (or once
// p.Timeout elapsed), the device's
// close (before or during the handshake) ib.ErrDeviceClosed or, once the
// REQ is out, ErrDisconnected. p may be nil.
// A Dial that fails before the REP leaves q as it was given (RESET or
// INIT), so it can dial again; once the REP began moving q, a failure
// (moving q, sending the RTU, ctx) leaves q in ERR, as rdma_cm's
// cma_rep_recv does. A nil p is librdmacm's NULL conn_param: retry and
// RNR retry counts 7 (ConnParam).
func Dial(ctx context.Context, q *ib.QP, raddr netip.AddrPort, p *ConnParam) (*Conn, error) {
	if p == nil {
		p = defaultConnParam()
	}
	if err := checkConnQP(q); err != nil {
		return nil, fmt.Errorf("rdmacm: Dial: %w", err)
	}
	if !raddr.Addr().IsValid() || raddr.Addr().IsUnspecified() || raddr.Port() == 0 {
		return nil, fmt.Errorf("rdmacm: Dial: invalid address %v", raddr)
	}
	if len(p.PrivateData) > maxPrivateREQ {
		return nil, fmt.Errorf("rdmacm: Dial: %d bytes of private data (a REQ carries at most %d after rdma_cm's header)", len(p.PrivateData), maxPrivateREQ)
	}
	if p.RetryCount > maxRetry || p.RNRRetryCount > maxRetry {
		return nil, fmt.Errorf("rdmacm: Dial: retry counts are at most %d", maxRetry)
	}
	// An ended ctx sends nothing: the REQ (and the REJ that abandons
	// it) would otherwise go out for a Dial that can only fail, or, on a
	// fast network, win the race with ctx and connect.
	if err := qp.ContextError(ctx); err != nil {
		return nil, fmt.Errorf("rdmacm: Dial %v: %w", raddr, err)
	}
	dev := q.PD().Device()
	local, hdr, err := activeEnd(dev, p, raddr)
	if err != nil {
		return nil, fmt.Errorf("rdmacm: Dial: %w", err)
	}
	peer := hdr.Dst
	if p.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, p.Timeout, errTimeoutParam)
		defer cancel()
	}
	a, err := acquire(dev)
	if err != nil {
		return nil, fmt.Errorf("rdmacm: Dial: %w", err)
	}
	priv := append(hdr.Append(nil), p.PrivateData...)
	mtu := activeMTU(dev, local)
	psn := a.cm.NewPSN()
	transport := uint8(mad.TransportRC)
	if q.Type() == ib.UC {
		transport = mad.TransportUC
	}
	c := newConn(a, q)
	c.local, c.remote = netip.AddrPortFrom(local, hdr.SrcPort), netip.AddrPortFrom(peer, raddr.Port())
	id, err := a.cm.Connect(cm.ConnectParams{
		Src: local, Dst: peer, ServiceID: serviceID(p.PortSpace, raddr.Port()),
		QPN: q.Num(), StartingPSN: psn, TransportType: transport,
		ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
		RetryCount: p.RetryCount, RNRRetryCount: p.RNRRetryCount,
		PathMTU: uint8(mtu), PacketLifeTime: packetLifeTime, HopLimit: hopLimit, TrafficClass: p.TOS,
		SRQ: usesSRQ(q), PrivateData: priv,
	}, c.onEvent)
	if err != nil {
		err = cmErr(err)
		c.fail(err, false)
		return nil, fmt.Errorf("rdmacm: Dial: %w", err)
	}
	c.mu.Lock()
	c.id = id
	c.mu.Unlock()
	onREP := func(rep *mad.REP) error {
		s := activeSetup(dev, p, local, peer, mtu, psn, rep, id.ACKTimeout())
		c.movingQP()
		if err := ib.ConnectQP(q, s.remote, s.attr); err != nil {
			// cma_rep_recv: a QP that cannot be moved is refused.
			_ = id.Reject(mad.REJConsumerDefined, nil, nil)
			c.fail(err, false)
			return err
		}
		c.setPrivate(rep.PrivateData)
		if err := id.SendRTU(nil); err != nil {
			c.fail(err, true)
			return err
		}
		return nil
	}
	if err := c.await(ctx, onREP); err != nil {
		return nil, fmt.Errorf("rdmacm: Dial %v: %w", raddr, err)
	}
	return c, nil
}

// activeEnd resolves the active side of a connection to raddr: our GID
// (p.Local or the device's first of the peer's family), our rdma_cm port
// (p.LocalPort or an ephemeral one) and rdma_cm's header naming both.
func activeEnd(dev *ib.Device, p *ConnParam, raddr netip.AddrPort) (netip.Addr, mad.CMAHeader, error) {
	peer := raddr.Addr().Unmap()
	local, ok := localGID(dev, p.Local, peer)
	if !ok {
		return local, mad.CMAHeader{}, fmt.Errorf("no local address for %v (device GIDs %v)", peer, dev.GIDs())
	}
	if local.Is4() != peer.Is4() {
		return local, mad.CMAHeader{}, fmt.Errorf("local %v and remote %v are of different families", local, peer)
	}
	lport := p.LocalPort
	if lport == 0 {
		lport = uint16(32768 + rand.IntN(61000-32768))
	}
	return local, mad.CMAHeader{IPVersion: ipVersion(peer), SrcPort: lport, Src: local, Dst: peer}, nil
}

// checkConnQP checks that q can be connected: RC or UC, in RESET or INIT
// (where rdma_create_qp leaves it, so that receives can be posted before
// the peer's first SEND).
func checkConnQP(q *ib.QP) error {
	if q == nil {
		return errors.New("nil QP")
	}
	if t := q.Type(); t != ib.RC && t != ib.UC {
		return fmt.Errorf("QP %#x is %v: connections are RC or UC (UD uses DialUD)", q.Num(), t)
	}
	if s := q.State(); s != ib.QPSReset && s != ib.QPSInit {
		return fmt.Errorf("QP %#x is in %v: it must be in RESET or INIT", q.Num(), s)
	}
	return nil
}

// usesSRQ reports whether q receives through a shared receive queue: the
// SRQ bit of our REQ or REP, as cma_connect_ib and cma_accept_ib set it
// (id_priv->srq, from rdma_create_qp). It was always clear.
func usesSRQ(q *ib.QP) bool {
	_, init, err := q.Query()
	return err == nil && init.SRQ != nil
}

func ipVersion(a netip.Addr) uint8 {
	if a.Unmap().Is4() {
		return 4
	}
	return 6
}
