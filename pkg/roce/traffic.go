package roce

import (
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// udTraffic tells the Conn, when it can report received TOS and TTL
// (transport.TrafficReporter), that a UD QP was created (on) or
// destroyed: a UD receive's GRH holds the received IP header, rxe's
// copy of it, so the Conn reports them while any UD QP exists, and a
// device without one pays nothing per packet. The GSI QP does not count:
// the MAD layer reads only the GRH's addresses.
func (e *Engine) udTraffic(t qp.Type, on bool) {
	if t != qp.UD {
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
// received TOS and TTL, as udTraffic has the engine's Conn, so that a
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
