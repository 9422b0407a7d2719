package rdmacm

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/wire/mad"
)

// UDRemote is a UD service resolved by SIDR: where to send datagrams.
type UDRemote struct {
	Addr netip.AddrPort // the service's address and port
	GID  netip.Addr     // the peer's GID, for the address handle
	QPN  uint32         // the peer's UD QP
	QKey uint32         // the Q_Key its QP accepts (rdma_cm's RDMA_UDP_QKEY 0x01234567 for librdmacm peers)
	// TrafficClass and HopLimit are for the address handle, as rdma_cm's
	// ud_param.ah_attr: cma_sidr_rep_handler builds it from the dialer's
	// own path (ib_init_ah_attr_from_path), not from the SIDR_REP, which
	// carries no path, and cma_resolve_iboe_route made that path's
	// traffic class the ID's tos (ConnParam.TOS) and its hop limit the
	// route's (64). The datagrams then leave with them as their IP TOS
	// and TTL (IPv6 traffic class and hop limit).
	TrafficClass, HopLimit uint8
	// PrivateData is the SIDR_REP's, whole as on the wire.
	PrivateData []byte
}

// DialUD resolves the UD service at raddr by SIDR (rdma_connect on a UD
// rdma_cm ID): it sends a SIDR_REQ in the UDP port space with rdma_cm's
// header and p.PrivateData (at most 180 bytes), and returns the QPN and
// Q_Key from the SIDR_REP, with the traffic class (p.TOS) and hop limit
// to send with (UDRemote). A status other than success is a *SIDRError
// (no listener: unsupported service), silence ErrTimeout, the device's
// close ib.ErrDeviceClosed. p may be nil.
func DialUD(ctx context.Context, dev *ib.Device, raddr netip.AddrPort, p *ConnParam) (*UDRemote, error) {
	if p == nil {
		p = &ConnParam{}
	}
	if dev == nil {
		return nil, fmt.Errorf("rdmacm: DialUD: nil device")
	}
	if !raddr.Addr().IsValid() || raddr.Addr().IsUnspecified() || raddr.Port() == 0 {
		return nil, fmt.Errorf("rdmacm: DialUD: invalid address %v", raddr)
	}
	if len(p.PrivateData) > maxPrivateSIDR {
		return nil, fmt.Errorf("rdmacm: DialUD: %d bytes of private data (a SIDR_REQ carries at most %d after rdma_cm's header)", len(p.PrivateData), maxPrivateSIDR)
	}
	if err := qp.ContextError(ctx); err != nil { // as Dial: nothing sent
		return nil, fmt.Errorf("rdmacm: DialUD %v: %w", raddr, err)
	}
	local, hdr, err := activeEnd(dev, p, raddr)
	if err != nil {
		return nil, fmt.Errorf("rdmacm: DialUD: %w", err)
	}
	peer := hdr.Dst
	if p.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, p.Timeout, errTimeoutParam)
		defer cancel()
	}
	a, err := acquire(dev)
	if err != nil {
		return nil, fmt.Errorf("rdmacm: DialUD: %w", err)
	}
	ps := p.PortSpace
	if ps == 0 {
		ps = mad.PortSpaceUDP
	}
	res := make(chan cm.SIDRResult, 1)
	// The SIDR_REQs leave on the path's AH, as ib_send_cm_sidr_req's:
	// the TOS is its traffic class.
	id, err := a.cm.SIDRQuery(cm.SIDRParams{Src: local, Dst: peer, ServiceID: serviceID(ps, raddr.Port()),
		PrivateData: append(hdr.Append(nil), p.PrivateData...), TrafficClass: p.TOS, HopLimit: hopLimit},
		func(r cm.SIDRResult) { res <- r })
	if err != nil {
		return nil, fmt.Errorf("rdmacm: DialUD: %w", cmErr(err))
	}
	select {
	case <-ctx.Done():
		// Abandoned, as rdma_destroy_id cancels the kernel's query: no
		// SIDR_REQ is retransmitted after this.
		id.Destroy()
		return nil, fmt.Errorf("rdmacm: DialUD %v: %w", raddr, qp.ContextError(ctx))
	case <-a.gone:
		return nil, fmt.Errorf("rdmacm: DialUD %v: %w", raddr, ib.ErrDeviceClosed)
	case r := <-res:
		switch {
		case r.Err != nil:
			return nil, fmt.Errorf("rdmacm: DialUD %v: %w", raddr, ErrTimeout)
		case r.Status != mad.SIDRSuccess:
			return nil, fmt.Errorf("rdmacm: DialUD %v: %w", raddr, &SIDRError{Status: r.Status})
		}
		return &UDRemote{Addr: raddr, GID: peer, QPN: r.QPN, QKey: r.QKey,
			TrafficClass: p.TOS, HopLimit: hopLimit, PrivateData: r.PrivateData}, nil
	}
}
