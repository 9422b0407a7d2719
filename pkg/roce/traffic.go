package roce

import (
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// datagramTraffic tells the Conn, when it can report received TOS and TTL
// (transport.TrafficReporter), that a UD or the GSI QP was created (on)
// or destroyed: a datagram QP's receive GRH holds the received IP header,
// rxe's copy of it, so the Conn reports them while any exists, and a
// device with neither pays nothing per packet.
//
// The GSI QP counts only on a device with an IPv6 GID (gsiReadsTraffic):
// the CM answers some MADs with the traffic class of their GRH
// (ib.MADTrafficHandler, cm.Traffic), so an IPv6 peer's REQ for a port
// nobody listens on is refused at the REQ's traffic class, as by the
// kernel; over IPv4 that class is 0 whatever arrived (rxe's IPv4 GRH
// starts with 20 zero bytes). A device's rdma_cm agent holds QP 1 from
// its first use until the device closes, so on an IPv6 device its
// sockets then report always: every datagram received, RC data too,
// costs the kernel two control messages more (IPV6_TCLASS and
// IPV6_HOPLIMIT, plus IPV6_FLOWINFO for one with a flow label: 48 to 72
// bytes of the receive's control buffer) and parseCmsgs two or three
// more steps of its walk, in place and without allocation. An IPv4-only
// device, the common one, pays none of it for a class it would not use.
func (e *Engine) datagramTraffic(t qp.Type, on bool) {
	if !t.Datagram() || (t == qp.GSI && !e.gsiReadsTraffic()) {
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

// gsiReadsTraffic reports whether the GSI QP's receives need the received
// traffic class: only an IPv6 peer's MADs are answered with it, and only
// a device with an IPv6 GID has such peers (GIDs are fixed when the
// engine is made).
func (e *Engine) gsiReadsTraffic() bool {
	for _, g := range e.gids {
		if !g.Is4() {
			return true
		}
	}
	return false
}
