package transport

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
)

// Multicast groups. A RoCEv2 multicast datagram is an ordinary UDP
// datagram to an IP multicast address (the multicast GID, IPv4-mapped for
// IPv4 groups) on port 4791; what a Conn must add is membership: the host
// joins the group (IGMP / MLD, as rdma_cm's cma_igmp_send does for rxe) and
// the datagrams reach the engine. How they reach it differs:
//
//   - MemNetwork: through the joining Conn itself, with Endpoint.Local the
//     group's address and port. Every member gets a copy, the sending Conn
//     included when it is a member (IP_MULTICAST_LOOP, on by default for
//     every socket, does the same on a host).
//   - UDP on Linux: a Linux UDP socket bound to a unicast address never
//     sees datagrams to a group, so joining opens one more socket, bound to
//     group:port (SO_REUSEADDR, so that several engines of one host can
//     join), and adds the membership on the interface of each of the Conn's
//     addresses (IP_ADD_MEMBERSHIP with ip_mreqn.imr_address /
//     IPV6_JOIN_GROUP with that address's interface). Its datagrams arrive
//     on Membership.Conn, which the caller reads until Leave.

// GroupJoiner is implemented by Conns whose network can carry multicast.
type GroupJoiner interface {
	// JoinGroup makes the Conn's host a member of group (an IPv4 or IPv6
	// multicast address, IPv4-mapped accepted) on the Conn's port. The
	// caller joins a group at most once per Conn.
	JoinGroup(group netip.Addr) (*Membership, error)
}

// Membership is one joined group.
type Membership struct {
	// Group is the group's address (unmapped).
	Group netip.Addr
	// Conn carries the group's datagrams when they do not arrive through
	// the joined Conn itself (UDP: the socket bound to the group); nil
	// otherwise. It is receive-only; Leave closes it.
	Conn Conn

	once  sync.Once
	leave func() error
	err   error
}

// Leave ends the membership (IGMP / MLD leave) and closes Conn. Calling it
// again returns the first call's result. A Membership made by a
// GroupJoiner of another package (no leave of this package's) has its Conn
// closed, as the doc of Conn promises, so its reader ends.
func (m *Membership) Leave() error {
	m.once.Do(func() {
		switch {
		case m.leave != nil:
			m.err = m.leave()
		case m.Conn != nil:
			m.err = m.Conn.Close()
		}
	})
	return m.err
}

// ErrNoMulticast is returned by JoinGroup for a Conn that cannot join
// groups (a Conn of another package, UDP outside Linux).
var ErrNoMulticast = errors.New("transport: the Conn cannot join multicast groups")

// ErrNotGroup is returned by JoinGroup for an address that is not an IP
// multicast address.
var ErrNotGroup = errors.New("transport: not a multicast address")

// IsGroup reports whether a (IPv4-mapped accepted) is an IP multicast
// address: 224.0.0.0/4 or ff00::/8, as rdma_is_multicast_addr decides for
// a GID.
func IsGroup(a netip.Addr) bool { return a.IsValid() && a.Unmap().IsMulticast() }

// JoinGroup joins group on c, looking through this package's wrappers
// (NewFaulty, NewPcapRecorder) for a GroupJoiner. The wrappers see the
// group's outgoing datagrams (they go through Send). A separate
// Membership.Conn's incoming ones are recorded by every PcapRecorder on the
// way (into the same capture, so that it holds what the engine received
// on the group too); a Faulty does not see them.
func JoinGroup(c Conn, group netip.Addr) (*Membership, error) {
	if !IsGroup(group) {
		return nil, fmt.Errorf("%w: %v", ErrNotGroup, group)
	}
	var recs []*PcapRecorder // outermost first
	for c != nil {
		if j, ok := c.(GroupJoiner); ok {
			m, err := j.JoinGroup(group.Unmap())
			if err != nil || m.Conn == nil {
				return m, err
			}
			for i := len(recs) - 1; i >= 0; i-- {
				m.Conn = &pcapGroupConn{Conn: m.Conn, r: recs[i]}
			}
			return m, nil
		}
		switch w := c.(type) {
		case *Faulty:
			c = w.inner
		case *PcapRecorder:
			recs = append(recs, w)
			c = w.inner
		default:
			c = nil
		}
	}
	return nil, ErrNoMulticast
}

// pcapGroupConn is a membership's own Conn seen through the PcapRecorder of
// the Conn that joined: what it receives goes into that recorder's capture.
type pcapGroupConn struct {
	Conn
	r *PcapRecorder
}

// ReportTraffic implements TrafficReporter: the group Conn's.
func (g *pcapGroupConn) ReportTraffic(on bool) error { return reportTraffic(g.Conn, on) }

func (g *pcapGroupConn) Receive(bufs [][]byte, sizes []int, eps []Endpoint) (int, error) {
	n, err := g.Conn.Receive(bufs, sizes, eps)
	g.r.recordReceived(bufs, sizes, eps, n)
	return n, err
}

// memGroups is a MemNetwork's group membership: the member Conns of each
// group address and port.
type memGroups struct {
	mu      sync.Mutex // guards members
	members map[netip.AddrPort]map[*memConn]struct{}
}

// JoinGroup implements GroupJoiner: datagrams sent to group:port (port the
// Conn's) are delivered to this Conn too.
func (c *memConn) JoinGroup(group netip.Addr) (*Membership, error) {
	group = group.Unmap()
	if !IsGroup(group) {
		return nil, fmt.Errorf("%w: %v", ErrNotGroup, group)
	}
	select {
	case <-c.q.closed:
		return nil, errClosed
	default:
	}
	if group.Is4() != c.local.Addr().Is4() {
		return nil, fmt.Errorf("transport: JoinGroup %v: the Conn's address %v is of the other family", group, c.local.Addr())
	}
	key := netip.AddrPortFrom(group, c.local.Port())
	g := &c.net.groups
	g.mu.Lock()
	if g.members == nil {
		g.members = make(map[netip.AddrPort]map[*memConn]struct{})
	}
	set := g.members[key]
	if set == nil {
		set = make(map[*memConn]struct{})
		g.members[key] = set
	}
	if _, dup := set[c]; dup {
		g.mu.Unlock()
		return nil, fmt.Errorf("transport: JoinGroup %v: already a member", group)
	}
	set[c] = struct{}{}
	g.mu.Unlock()
	return &Membership{Group: group, leave: func() error { g.leave(key, c); return nil }}, nil
}

func (g *memGroups) leave(key netip.AddrPort, c *memConn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if set := g.members[key]; set != nil {
		delete(set, c)
		if len(set) == 0 {
			delete(g.members, key)
		}
	}
}

// leaveAll removes c from every group (c is closing).
func (g *memGroups) leaveAll(c *memConn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for key, set := range g.members {
		delete(set, c)
		if len(set) == 0 {
			delete(g.members, key)
		}
	}
}

// sendGroup delivers bufs to every member of ep.Remote (the sender
// included, as IP_MULTICAST_LOOP would), each seeing Local = the group.
// A group nobody joined counts as no route, as a unicast address nobody
// listens on does.
func (c *memConn) sendGroup(bufs [][]byte, ep Endpoint) {
	key := netip.AddrPortFrom(ep.Remote.Addr().Unmap(), ep.Remote.Port())
	g := &c.net.groups
	g.mu.Lock()
	members := make([]*memConn, 0, len(g.members[key]))
	for m := range g.members[key] {
		members = append(members, m)
	}
	g.mu.Unlock()
	c.countSent(bufs)
	if len(members) == 0 {
		c.stats.dropNoRoute.Add(uint64(len(bufs)))
		return
	}
	for _, m := range members {
		arrived := m.arrival(key, c.local, ep)
		for _, b := range bufs {
			if !m.q.push(b, arrived) {
				m.stats.dropQueueFull.Add(1)
			}
		}
	}
}
