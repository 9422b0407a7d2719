package rdmacm

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/wire/mad"
)

// rdma_cm's constants (cma.c) for RoCE.
const (
	// packetLifeTime is CMA_IBOE_PACKET_LIFETIME: the REQ's packet life
	// time on RoCE, from which cm.c computes the local ACK timeout it
	// sends (19 with rdma_rxe's CA ACK delay 15, as the captures show).
	packetLifeTime = 18
	// maxPrivateREQ is what a REQ carries of the application's private
	// data after rdma_cm's header.
	maxPrivateREQ = mad.REQPrivateLen - mad.CMAHeaderLen
	// maxPrivateSIDR likewise for SIDR_REQ.
	maxPrivateSIDR = mad.SIDRREQPrivateLen - mad.CMAHeaderLen
	// maxRetry is the largest retry count (3 bits).
	maxRetry = 7
	// hopLimit is what rdma_cm puts in the REQ path on RoCE (the
	// route's hop limit, cma_resolve_iboe_route: 64 by default), and both
	// sides' AVs: the passive side's is the route's too, not the REQ's
	// (passiveSetup).
	hopLimit = 64
)

// defaultConnParam is what Dial and Accept use for a nil *ConnParam:
// librdmacm's ucma_copy_conn_param_to_kern without one sets retry_count
// and rnr_retry_count to 7 (the resources come from the device and, for
// Accept, the REQ, as for any ConnParam). A zero ConnParam would give the
// peer no retries at all: one lost packet or one RNR NAK would fail its
// work with RETRY_EXC_ERR / RNR_RETRY_EXC_ERR, where a librdmacm
// application passing NULL never sees that.
func defaultConnParam() *ConnParam { return &ConnParam{RetryCount: maxRetry, RNRRetryCount: maxRetry} }

// ConnParam is the application's side of a connection (struct
// rdma_conn_param). Zero values take the defaults named per field.
// Dial and Accept given nil use defaultConnParam's, as librdmacm's
// rdma_connect and rdma_accept given a NULL conn_param.
type ConnParam struct {
	// PrivateData goes to the peer: in the REQ after rdma_cm's header
	// (Dial: at most 56 bytes), in the REP (Accept: at most 196).
	PrivateData []byte
	// ResponderResources is how many RDMA READs and atomics we let the
	// peer have outstanding at us (max_dest_rd_atomic); InitiatorDepth
	// how many we issue (max_rd_atomic). Accept: 0 takes what the REQ
	// offered (its initiator depth and responder resources).
	ResponderResources, InitiatorDepth uint8
	// RetryCount and RNRRetryCount are the transport's retries (at most
	// 7; 7 RNR retries mean infinite). Dial's RetryCount is both sides';
	// each side's RNRRetryCount is what its peer uses (it travels in the
	// REQ and REP). 0 means none: the first lost packet (or RNR NAK)
	// beyond the timeout fails the peer's work. A nil *ConnParam is
	// librdmacm's NULL conn_param: 7 and 7 (defaultConnParam).
	RetryCount, RNRRetryCount uint8
	// MinRNRTimer is the RNR NAK timer code our responder sends; 0 is the
	// kernel's value (0, meaning 655 ms).
	MinRNRTimer uint8
	// ACKTimeout overrides the local ACK timeout exponent (rdma_cm's
	// RDMA_OPTION_ID_ACK_TIMEOUT); 0 derives it from the CM exchange.
	ACKTimeout uint8
	// TOS is the connection's IP TOS (IPv6 traffic class: DSCP and ECN),
	// rdma_cm's RDMA_OPTION_ID_TOS, for Dial: on RoCE cma.c makes it the
	// path's traffic class (cma_resolve_iboe_route), so it travels in
	// the REQ's primary path and both QPs' AVs carry it, and with them
	// every packet of the connection, ACKs and READ responses included,
	// and its CM MADs (cm.c sends them on the cm_id's primary AV).
	// For DialUD it is UDRemote.TrafficClass, the address handle's, as
	// rdma_cm's ud_param.ah_attr.
	// 0 is rdma_cm's default (default_roce_tos 0). Accept's QP takes the
	// REQ's traffic class whatever this says, as the kernel's passive
	// side builds its AV from the REQ's path.
	TOS uint8
	// Local is our address for Dial (a GID of the device); invalid means
	// the device's first GID of the peer's family.
	Local netip.Addr
	// LocalPort is the source port Dial puts in rdma_cm's header (the
	// kernel binds an ephemeral port); 0 picks one at random.
	LocalPort uint16
	// PortSpace is the rdma_cm port space; 0 is mad.PortSpaceTCP.
	PortSpace mad.PortSpace
	// Timeout bounds the whole exchange besides ctx; 0 is none (the CM's
	// own retries still end it: 16 REQs 4.3 s apart, about 70 s). Its
	// expiry is ErrTimeout (and context.DeadlineExceeded), as the CM's
	// own retries running out: the peer did not answer in time.
	Timeout time.Duration
}

// errTimeoutParam is the cause of a ConnParam.Timeout's expiry: with
// qp.ContextError the wait's error is then both ErrTimeout and
// context.DeadlineExceeded. A bare deadline looked like the caller's own
// ctx expiring, and matched none of the package's errors.
var errTimeoutParam = fmt.Errorf("%w: ConnParam.Timeout elapsed", ErrTimeout)

// initAccess is the INIT access of a connected QP (cm_init_qp_init_attr):
// remote WRITE always, READ and atomics when we have responder
// resources.
func initAccess(responderResources uint8) ib.Access {
	a := ib.AccessRemoteWrite
	if responderResources > 0 {
		a |= ib.AccessRemoteRead | ib.AccessRemoteAtomic
	}
	return a
}

// ibMTU converts an IBA MTU code (REQ path MTU) to ib.MTU, which uses
// the same encoding (1: 256 ... 5: 4096); anything else is 1024.
func ibMTU(code uint8) ib.MTU {
	if code < 1 || code > 5 {
		return ib.MTU1024
	}
	return ib.MTU(code)
}

// iboeMTU is cma.c's iboe_get_mtu: the largest IB MTU whose RoCEv2
// packet (GRH-sized IP header, UDP, BTH, the largest extension headers
// and ICRC) fits a link of linkMTU bytes.
func iboeMTU(linkMTU int) ib.MTU {
	n := linkMTU - (40 + 8 + 12 + 4 + 28 + 4)
	switch {
	case n >= 4096:
		return ib.MTU4096
	case n >= 2048:
		return ib.MTU2048
	case n >= 1024:
		return ib.MTU1024
	case n >= 512:
		return ib.MTU512
	default:
		return ib.MTU256
	}
}

// activeMTU is the path MTU an active side offers: the port's active MTU,
// capped by the link MTU of the interface that holds local (when one
// does: a MemNetwork address has none).
func activeMTU(dev *ib.Device, local netip.Addr) ib.MTU {
	pa, err := dev.QueryPort(1)
	mtu := ib.MTU1024
	if err == nil {
		mtu = pa.ActiveMTU
	}
	if link := linkMTU(local); link > 0 {
		mtu = min(mtu, iboeMTU(link))
	}
	return mtu
}

// linkMTU returns the MTU of the interface that has address a, or 0.
func linkMTU(a netip.Addr) int {
	ifs, err := net.Interfaces()
	if err != nil {
		return 0
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, ad := range addrs {
			if p, ok := ad.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(p.IP); ok && ip.Unmap() == a.Unmap() {
					return ifc.MTU
				}
			}
		}
	}
	return 0
}

// qpSetup is everything a side needs to take its QP to RTS, derived from
// the CM exchange.
type qpSetup struct {
	remote ib.RemoteQP
	attr   ib.ConnectAttr
}

// activeSetup derives the active side's QP attributes from its REQ
// parameters and the REP (cm_rep_handler, cm_init_qp_rtr/rts_attr, cma.c's
// conn_param overrides).
func activeSetup(dev *ib.Device, p *ConnParam, local, peer netip.Addr, mtu ib.MTU, ourPSN uint32, rep *mad.REP, avTimeout uint8) qpSetup {
	s := qpSetup{
		// A CM message's Starting PSN is the PSN its sender will receive
		// from (ib_send_cm_req: rq_psn = the REQ's; cm_rep_handler: sq_psn
		// = the REP's), so we send from the REP's and receive from ours.
		remote: ib.RemoteQP{QPN: rep.LocalQPN, PSN: ourPSN, GID: peer, UDPPort: dev.UDPPort(), MTU: mtu},
		attr: ib.ConnectAttr{
			SGIDIndex: dev.GIDIndex(local), PSN: rep.StartingPSN, AccessFlags: initAccess(p.ResponderResources),
			Timeout: avTimeout, RetryCnt: min(p.RetryCount, maxRetry), RNRRetry: rep.RNRRetryCount,
			MinRNRTimer: p.MinRNRTimer, MaxRdAtomic: p.InitiatorDepth, MaxDestRdAtomic: p.ResponderResources,
			HopLimit: hopLimit, TrafficClass: p.TOS,
		},
	}
	if p.ACKTimeout != 0 {
		s.attr.Timeout = p.ACKTimeout
	}
	return s
}

// passiveSetup derives the passive side's QP attributes from the REQ and
// its accept parameters (cm_req_handler, cm_format_paths_from_req: the
// path's packet life time is the REQ's local ACK timeout - 1, so the ACK
// timeout is the REQ's local ACK timeout). Its traffic class is the REQ's
// primary path's, which cm_init_av_by_path's ib_init_ah_attr_from_path
// puts in the AV's GRH, so on RoCE every packet of the QP carries it as
// its IP TOS; its hop limit is not the REQ's but the route's (64):
// cm_req_handler overwrites the path's with that of the AV it built to
// answer the REQ (work->path[0].hop_limit = grh->hop_limit, from
// ib_init_ah_attr_from_wc).
func passiveSetup(dev *ib.Device, p *ConnParam, local, peer netip.Addr, req *mad.REQ, ourPSN uint32) qpSetup {
	mtu := ibMTU(req.PathMTU)
	if pa, err := dev.QueryPort(1); err == nil {
		mtu = min(mtu, pa.ActiveMTU)
	}
	timeout := req.Primary.LocalACKTimeout
	if p.ACKTimeout != 0 {
		timeout = p.ACKTimeout
	}
	return qpSetup{
		// cm_req_handler: sq_psn = the REQ's Starting PSN; ib_send_cm_rep:
		// rq_psn = our REP's.
		remote: ib.RemoteQP{QPN: req.LocalQPN, PSN: ourPSN, GID: peer, UDPPort: dev.UDPPort(), MTU: mtu},
		attr: ib.ConnectAttr{
			SGIDIndex: dev.GIDIndex(local), PSN: req.StartingPSN, AccessFlags: initAccess(p.ResponderResources),
			Timeout: timeout, RetryCnt: req.RetryCount, RNRRetry: req.RNRRetryCount,
			MinRNRTimer: p.MinRNRTimer, MaxRdAtomic: p.InitiatorDepth, MaxDestRdAtomic: p.ResponderResources,
			HopLimit: hopLimit, TrafficClass: req.Primary.TrafficClass,
		},
	}
}

// acceptDefaults fills an Accept's zero resources from the REQ, as
// librdmacm's rdma_accept (the REQ's initiator depth is what the peer will
// issue at us, its responder resources what it lets us issue), clamped to
// the device's limits.
func acceptDefaults(dev *ib.Device, p ConnParam, req *mad.REQ) ConnParam {
	da := dev.QueryDevice()
	if p.ResponderResources == 0 {
		p.ResponderResources = req.InitiatorDepth
	}
	if p.InitiatorDepth == 0 {
		p.InitiatorDepth = req.ResponderResources
	}
	p.ResponderResources = uint8(min(int(p.ResponderResources), da.MaxQPRdAtom))
	p.InitiatorDepth = uint8(min(int(p.InitiatorDepth), da.MaxQPInitRdAtom))
	p.RNRRetryCount = min(p.RNRRetryCount, maxRetry)
	return p
}
