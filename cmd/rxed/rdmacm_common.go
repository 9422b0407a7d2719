package main

// What rping, cmatose and udaddy share: the connection parameters they pass
// to the rdma_cm glue (rdmacm_glue.go, the only file that calls
// pkg/rdmacm), QP setup the way rdma_create_qp leaves a QP, waiting for
// completions while watching the connection, and picking the engine's
// address from the tools' own address flags.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/rxed/rxed/pkg/ib"
)

// rdmaUDPQKey is RDMA_UDP_QKEY: the Q_Key rdma_cm gives every UD QP of
// the UDP port space, and what a SIDR_REP carries back.
const rdmaUDPQKey = 0x01234567

// cmParams is what a tool passes to connect or accept (struct
// rdma_conn_param plus the local address rdma_resolve_addr binds).
type cmParams struct {
	local          netip.Addr // our GID (the engine's address)
	respResources  uint8
	initiatorDepth uint8
	retryCount     uint8
	rnrRetryCount  uint8
	// ackTimeout is the local ACK timeout exponent (rdma_set_option's
	// RDMA_OPTION_ID_ACK_TIMEOUT); 0 derives it from the CM exchange as
	// rdma_cm does (19 on RoCE: 2.1 s before a lost packet is resent).
	ackTimeout uint8
	// tos is the connection's IP TOS (rdma_set_option's
	// RDMA_OPTION_ID_TOS, ucmatose's and udaddy's -t, perftest's -T): a
	// dialer's REQ path and every packet of the connection carry it, a
	// SIDR dialer's address handle too. Accepting, the REQ's traffic
	// class wins, as on the kernel's passive side. 0 is rdma_cm's
	// default.
	tos     uint8
	timeout time.Duration // bound on the whole exchange
}

// initQPForCM moves a new RC QP to INIT as rdma_create_qp does
// (cma_init_conn_qp: port 1, P_Key index 0, remote write and, with
// responder resources, remote read), so the tools can post their
// receives before they connect or accept, as the C tools do.
func initQPForCM(q *ib.QP) error {
	if err := initQP(q, ib.RC, 0, ib.AccessRemoteWrite|ib.AccessRemoteRead); err != nil {
		return fmt.Errorf("modifying the QP to INIT: %v", err)
	}
	return nil
}

// readyUDQP moves a new UD QP to RTS with rdma_cm's Q_Key, as
// rdma_create_qp does for a UD id (cma_init_ud_qp).
func readyUDQP(q *ib.QP) error {
	if err := initQP(q, ib.UD, rdmaUDPQKey, 0); err != nil {
		return fmt.Errorf("modifying the UD QP to INIT: %v", err)
	}
	if err := q.Modify(&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState); err != nil {
		return fmt.Errorf("modifying the UD QP to RTR: %v", err)
	}
	if err := q.Modify(&ib.QPAttr{State: ib.QPSRTS, SQPSN: 0}, ib.AttrState|ib.AttrSQPSN); err != nil {
		return fmt.Errorf("modifying the UD QP to RTS: %v", err)
	}
	return nil
}

// errPeerDisconnected is what a completion wait returns when the
// connection ended first (rping's DISCONNECTED state).
var errPeerDisconnected = errors.New("the peer disconnected")

// wcWait waits for the next completions on cq: at most timeout, and no
// longer than the connection lasts (done closes when the peer's DREQ
// arrives; nil: no connection to watch).
func wcWait(ctx context.Context, cq *ib.CQ, wcs []ib.WC, done <-chan struct{}, timeout time.Duration) (int, error) {
	if n := cq.Poll(wcs); n > 0 {
		return n, nil
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if done != nil {
		go func() {
			select {
			case <-done:
				cancel()
			case <-wctx.Done():
			}
		}()
	}
	n, err := cq.WaitPoll(wctx, wcs)
	if n > 0 {
		return n, nil
	}
	if done != nil {
		select {
		case <-done:
			// What arrived before the DREQ still counts.
			if n := cq.Poll(wcs); n > 0 {
				return n, nil
			}
			return 0, errPeerDisconnected
		default:
		}
	}
	if err == nil {
		err = context.DeadlineExceeded
	}
	return 0, err
}

// sourceFor picks the local address a client binds when it was given
// none: the one the host would send from to dst (rdma_resolve_addr with
// no source address asks the routing table the same way). Connecting a
// UDP socket sends nothing.
func sourceFor(dst netip.Addr) (netip.Addr, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 9)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no local address routes to %s: %v", dst, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}

// parseHost parses a tool's address argument (an IP address; rxed
// resolves no names).
func parseHost(flagName, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s %q: not an IP address", flagName, s)
	}
	return a.Unmap(), nil
}

// connectError is the one-line error of a failed connect: the peer and
// why (rejected with the reason, or no answer). server names what should
// answer a first REQ ("the server running there with -R"): a REQ nobody
// answered then says no rdma_cm listener answered and asks whether that
// runs, where the bare "no answer within --timeout" left the user to
// guess what was missing. It is empty for a peer that answered before
// (perf's test QPs after the control connection).
//
// The wait stays --timeout: rdma_cm gives a REQ the kernel's 15 retries
// of CMA_CM_RESPONSE_TIMEOUT 20 (cma.c; over a minute), librdmacm and
// perftest keep them, so the tools have no shorter answer to mirror.
func connectError(raddr netip.AddrPort, err error, timeout time.Duration, server string) error {
	var why string
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		why = fmt.Sprintf("within --timeout %v", timeout)
	case cmError(err) == errNoAnswer: // rdmacm.ErrTimeout (rdmacm_glue.go)
		why = "(CM timeout)"
	default:
		return fmt.Errorf("connect %s: %w", raddr, cmError(err))
	}
	if server == "" {
		return fmt.Errorf("connect %s: no answer %s", raddr, why)
	}
	return fmt.Errorf("connect %s: no rdma_cm listener answered %s (is %s?)", raddr, why, server)
}
