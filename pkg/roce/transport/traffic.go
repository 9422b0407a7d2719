package transport

import (
	"net/netip"
	"sync"
)

// DefaultHopLimit is the TTL (IPv6 hop limit) a socket sends with unless
// told otherwise: Linux's ip_default_ttl and hop_limit, which rdma_cm's
// path records carry too (cma.c takes the route's hop limit).
const DefaultHopLimit = 64

// ipTraffic is what a send sets in the IP header besides the defaults:
// the fields of Endpoint that need per-message work, zero when none do.
type ipTraffic struct {
	class uint8 // IPv4 TOS / IPv6 traffic class
	hops  uint8 // IPv4 TTL / IPv6 hop limit; 0: the socket's (DefaultHopLimit)
}

// trafficOf is ep's ipTraffic: a hop limit of DefaultHopLimit is the
// socket's already, so the common endpoint (0, 0 or 0, 64) needs nothing.
func trafficOf(ep Endpoint) ipTraffic {
	t := ipTraffic{class: ep.TrafficClass, hops: ep.HopLimit}
	if t.hops == DefaultHopLimit {
		t.hops = 0
	}
	return t
}

// TrafficReporter is implemented by Conns that can report the TOS and
// TTL (IPv6 traffic class, hop limit and flow label) of received
// datagrams in Endpoint.TrafficClass, HopLimit and FlowLabel. Reporting
// costs the kernel two or three control messages per datagram, so it is
// off until asked for: ReportTraffic(true) counts one user more,
// ReportTraffic(false) one less, and datagrams are reported while any
// user is counted (the engine counts its UD QPs, and on a device with an
// IPv6 GID the GSI QP: their GRH holds the received header, as rxe's).
type TrafficReporter interface {
	ReportTraffic(on bool) error
}

// endpoint is the Endpoint m was received on, at port (the socket's).
func (m *rxMsg) endpoint(port uint16) Endpoint {
	return Endpoint{Local: netip.AddrPortFrom(m.local, port), Remote: m.remote, TrafficClass: m.class, HopLimit: m.hops,
		FlowLabel: m.flow}
}

// trafficUsers counts a Conn's ReportTraffic users: udpConn and memConn
// report received TOS and TTL while it counts any. change counts one more
// (on) or one less, calling apply with the new state when reporting turns
// on or off; one less than none is nothing.
type trafficUsers struct {
	mu sync.Mutex
	n  int
}

func (u *trafficUsers) change(on bool, apply func(on bool) error) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	switch {
	case on:
		u.n++
		if u.n != 1 {
			return nil
		}
	case u.n == 0:
		return nil
	default:
		u.n--
		if u.n != 0 {
			return nil
		}
	}
	return apply(on)
}

// ReportTraffic implements TrafficReporter: the first user switches the
// kernel's TOS and TTL control messages on for every socket, the last
// one off.
func (c *udpConn) ReportTraffic(on bool) error {
	return c.traffic.change(on, func(on bool) error {
		var err error
		for _, s := range c.socks {
			if e := s.recvTraffic(on); e != nil && err == nil {
				err = e
			}
		}
		return err
	})
}

// reportTraffic is ReportTraffic for a wrapper of inner: inner's, when
// it reports; else nothing is reported, and asking is no error.
func reportTraffic(inner Conn, on bool) error {
	if r, ok := inner.(TrafficReporter); ok {
		return r.ReportTraffic(on)
	}
	return nil
}

// ReportTraffic implements TrafficReporter: the inner Conn's.
func (f *Faulty) ReportTraffic(on bool) error { return reportTraffic(f.inner, on) }

// ReportTraffic implements TrafficReporter: the inner Conn's.
func (r *PcapRecorder) ReportTraffic(on bool) error { return reportTraffic(r.inner, on) }

// ReportTraffic implements TrafficReporter: the inner Conn's (the
// daemon's traffic accounting embeds an RxFilterConn).
func (c *RxFilterConn) ReportTraffic(on bool) error { return reportTraffic(c.Conn, on) }
