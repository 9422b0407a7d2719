package roce

import (
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// datagramTraffic tells the Conn, when it can report received TOS and TTL
// (transport.TrafficReporter), that a UD or the GSI QP was created (on)
// or destroyed: a datagram QP's receive GRH holds the received IP header,
// rxe's copy of it, so the Conn reports them while any exists, and a
// device with neither pays nothing per packet. The GSI QP counts since
// the CM answers some MADs with the traffic class of their GRH
// (ib.MADTrafficHandler, cm.Traffic): an IPv6 peer's REQ for a port
// nobody listens on is refused at the REQ's traffic class, as by the
// kernel. As a device's rdma_cm agent holds QP 1 from its first use
// until the device closes, its sockets then report always: every
// datagram received, RC data too, costs the kernel two control messages
// more (IP_TOS and IP_TTL, or IPV6_TCLASS and IPV6_HOPLIMIT, plus
// IPV6_FLOWINFO for one with a flow label: 48 to 72 bytes of the
// receive's control buffer) and parseCmsgs two or three more steps of
// its walk, in place and without allocation; no syscall and nothing
// else per packet.
func (e *Engine) datagramTraffic(t qp.Type, on bool) {
	if !t.Datagram() {
		return
	}
	r, ok := e.conn.(transport.TrafficReporter)
	if !ok {
		return
	}
	if err := r.ReportTraffic(on); err != nil {
		// The GRH then shows TOS 0 and TTL 64, as before.
		e.log.Warn("roce: received TOS/TTL reporting", "on", on, "err", err)
	}
}

// groupTraffic has a multicast membership's own Conn (transport.JoinGroup's
// Membership.Conn: over UDP the socket bound to the group) report the
// received TOS and TTL, as datagramTraffic has the engine's Conn, so that a
// multicast receive's GRH holds them as a unicast UD receive's does. Only
// UD QPs attach to groups and a membership lasts while one is attached,
// so this is "while a UD QP exists" already, and a device without groups
// pays nothing per packet; the Conn is closed with the membership (Leave),
// which ends its reporting too.
func (e *Engine) groupTraffic(c transport.Conn) {
	r, ok := c.(transport.TrafficReporter)
	if !ok {
		return
	}
	if err := r.ReportTraffic(true); err != nil {
		// The group's GRHs then show TOS 0 and TTL 64, as before.
		e.log.Warn("roce: received TOS/TTL reporting on a multicast group", "err", err)
	}
}
