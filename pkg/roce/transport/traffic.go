package transport

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
// TTL (IPv6 traffic class and hop limit) of received datagrams in
// Endpoint.TrafficClass and HopLimit. Reporting costs the kernel a
// control message or two per datagram, so it is off until asked for:
// ReportTraffic(true) counts one user more, ReportTraffic(false) one
// less, and datagrams are reported while any user is counted (the engine
// counts its UD QPs, whose GRH holds the received header, as rxe's).
type TrafficReporter interface {
	ReportTraffic(on bool) error
}
