package transport

import (
	"net/netip"

	"github.com/rxed/rxed/pkg/wire"
)

// The in-memory network's IP TOS and TTL (IPv6 traffic class and hop
// limit), as a host's kernel handles them: the datagram carries the
// sender's Endpoint.TrafficClass and HopLimit (0: the socket's,
// DefaultHopLimit; a group's datagrams too, as a udpConn's joined socket
// sends with IP_MULTICAST_TTL 64 unless the message says otherwise), and
// a receiving Conn reports them only while it is asked to
// (TrafficReporter), as udpConn does with IP_RECVTOS / IP_RECVTTL: 0 and
// 0 otherwise. A multicast member's copy is reported likewise, since it
// arrives through the member Conn itself. The IPv6 flow label likewise:
// the sender's Endpoint.FlowLabel (20 bits) reaches a reporting receiver
// of an IPv6 datagram, which a udpConn cannot send (it sends 0, as rxe)
// but a peer's kernel may; over IPv4 there is none.

// ReportTraffic implements TrafficReporter: users are counted as
// udpConn counts them; while any is, deliveries to c carry the TOS and
// TTL they were sent with.
func (c *memConn) ReportTraffic(on bool) error {
	return c.traffic.change(on, func(on bool) error {
		c.reporting.Store(on)
		return nil
	})
}

// arrival is the Endpoint a datagram sent on sent, from from, arrives on
// at c's address local: with the IP header's TOS and TTL while c reports
// them.
func (c *memConn) arrival(local, from netip.AddrPort, sent Endpoint) Endpoint {
	ep := Endpoint{Local: local, Remote: from}
	if c.reporting.Load() {
		ep.TrafficClass, ep.HopLimit = sent.TrafficClass, sent.HopLimit
		if ep.HopLimit == 0 {
			ep.HopLimit = DefaultHopLimit
		}
		if !from.Addr().Unmap().Is4() {
			ep.FlowLabel = sent.FlowLabel & wire.FlowLabelMask
		}
	}
	return ep
}
