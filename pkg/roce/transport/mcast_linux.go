//go:build linux

package transport

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// mcastHops is the TTL / hop limit of the multicast datagrams sent: the
// hop limit rdma_cm puts in a RoCEv2 group's address handle
// (cma_iboe_join_multicast: IPV6_DEFAULT_HOPLIMIT), where a socket's
// default would be 1. Neither is covered by the ICRC.
const mcastHops = 64

// JoinGroup implements GroupJoiner (see mcast.go): a socket bound to
// group:port receives the group's datagrams; the membership is added on
// the interface of every address of the group's family the Conn has.
func (c *udpConn) JoinGroup(group netip.Addr) (*Membership, error) {
	group = group.Unmap()
	if !IsGroup(group) {
		return nil, fmt.Errorf("%w: %v", ErrNotGroup, group)
	}
	var socks []*udpSocket
	for _, s := range c.socks {
		if s.is6 == group.Is6() {
			socks = append(socks, s)
		}
	}
	if len(socks) == 0 {
		return nil, fmt.Errorf("transport: JoinGroup %v: no local address of its family", group)
	}
	gc, err := OpenUDP(UDPConfig{Addrs: []netip.Addr{group}, Port: int(socks[0].local.Port()),
		Logger: c.log, BatchSize: c.batchSize})
	if err != nil {
		return nil, fmt.Errorf("transport: JoinGroup %v: %w", group, err)
	}
	g := gc.(*udpConn)
	joined := 0
	var joinErr error
	for _, s := range socks {
		err := joinOn(g.socks[0], group, s.local.Addr())
		switch {
		case err == nil, errors.Is(err, unix.EADDRINUSE): // two addresses on one interface
			joined++
		default:
			joinErr = err
		}
		if err := setSendOpts(s, group, s.local.Addr()); err != nil && joinErr == nil {
			joinErr = err
		}
	}
	if joined == 0 || joinErr != nil {
		gc.Close()
		return nil, fmt.Errorf("transport: JoinGroup %v: %w", group, joinErr)
	}
	c.log.Debug("transport: joined group", "group", group, "port", g.socks[0].local.Port())
	return &Membership{Group: group, Conn: gc, leave: gc.Close}, nil
}

// joinOn adds the membership of group on the interface that has local
// (IGMP / MLD report); closing the socket leaves.
func joinOn(s *udpSocket, group, local netip.Addr) error {
	var err error
	cerr := s.sys.rc.Control(func(fd uintptr) {
		if group.Is4() {
			m := unix.IPMreqn{Multiaddr: group.As4()}
			if !local.IsUnspecified() {
				m.Address = local.As4()
			}
			err = unix.SetsockoptIPMreqn(int(fd), unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, &m)
			if err != nil {
				err = fmt.Errorf("IP_ADD_MEMBERSHIP on %v: %w", local, err)
			}
			return
		}
		m := unix.IPv6Mreq{Multiaddr: group.As16(), Interface: uint32(ifIndexOf(local))}
		err = unix.SetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP, &m)
		if err != nil {
			err = fmt.Errorf("IPV6_JOIN_GROUP on %v: %w", local, err)
		}
	})
	if cerr != nil {
		return cerr
	}
	return err
}

// setSendOpts prepares a sending socket for the group: for IPv6, which has
// no "interface of the source address" rule as IPv4 routing does for a
// bound socket, the outgoing interface. Its multicast TTL / hop limit
// (mcastHops) every socket has had since it opened (udp_linux.go).
func setSendOpts(s *udpSocket, group, local netip.Addr) error {
	ix := ifIndexOf(local)
	if group.Is4() || ix <= 0 {
		return nil
	}
	var err error
	cerr := s.sys.rc.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_IF, ix)
	})
	if cerr != nil {
		return cerr
	}
	return err
}

// ifIndexOf is the index of the interface that has a, 0 if none does (or
// a is a wildcard: the kernel then picks by route).
func ifIndexOf(a netip.Addr) int {
	if a.IsUnspecified() {
		return 0
	}
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
			if p, err := netip.ParsePrefix(ad.String()); err == nil && p.Addr().Unmap() == a {
				return ifc.Index
			}
		}
	}
	return 0
}

// listenGroup opens the socket of a membership: bound to group:port itself
// with SO_REUSEADDR, so that several engines of one host can join and
// that it receives only the group's datagrams. net.ListenUDP would bind
// the wildcard address for a group (golang.org/issue/3219), which takes
// every unicast datagram to the port too and collides with the engines'
// own sockets.
func listenGroup(ap netip.AddrPort) (*net.UDPConn, error) {
	fam := unix.AF_INET
	var sa unix.Sockaddr = &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	if ap.Addr().Is6() {
		fam = unix.AF_INET6
		sa = &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("setsockopt SO_REUSEADDR", err)
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("bind", err)
	}
	f := os.NewFile(uintptr(fd), "udp-group")
	pc, err := net.FilePacketConn(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	return pc.(*net.UDPConn), nil
}
