//go:build linux

package transport

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

type sockSys struct {
	rc  syscall.RawConn // raw, or (a group's socket) the net package's
	raw *rawSocket
	gso atomic.Bool // cleared at run time if the kernel or device refuses GSO
	gro bool

	// Receive side, used by one receiver at a time: the socket's reader
	// goroutine, or (one socket, no reader) whoever holds the Conn's
	// receive lock.
	rxHdrs   []mmsghdr
	rxN      int
	rxErr    error
	recvFn   func(uintptr) bool
	hookedFn func(uintptr) bool // recvHooked, bound once
	pollFn   func(uintptr)      // recvPolled, bound once
	hookHdrs []mmsghdr          // readBatchHooked's batch
	hold     func() bool        // readBatchHooked's locks
	release  func()
	held     bool // the last hooked attempt returned holding the locks
	skipped  bool // ... without taking datagrams (hold said no)
	polled   bool // the last poll took datagrams
	// ovfl is the kernel's drop count last seen (SO_RXQ_OVFL), only
	// Linux's: the portable path has no control messages.
	ovfl uint32

	// Send side, under txMu.
	txMu    sync.Mutex
	txHdrs  []mmsghdr
	txIovs  []unix.Iovec
	txSegs  []int // bufs carried by each message
	txBytes []int // ... and their bytes
	txOOB   []byte
	txName  unix.RawSockaddrInet6
	txNameN uint32
	txSrc   []byte // the IP(V6)_PKTINFO cmsg selecting the source, or empty
	txSrcB  [64]byte
	txTraf  []byte // the TOS/TTL (traffic class/hop limit) cmsgs of a non-default Endpoint, or empty
	txTrafB [64]byte
	txOff   int
	txEnd   int
	txN     int
	txErr   error
	sendFn  func(uintptr) bool
	scope   uint32       // the interface index of a link-local bound address (its zone), else 0
	scopes  *scopeFinder // a socket bound to ::: the interfaces of the link-local sources it sends from
}

func openSocket(c *udpConn, ap netip.AddrPort, cfg *UDPConfig) (*udpSocket, error) {
	is6 := ap.Addr().Is6()
	network := "udp4"
	if is6 {
		network = "udp6"
	}
	var pc *net.UDPConn
	var err error
	if ap.Addr().IsMulticast() {
		pc, err = listenGroup(ap) // a membership's socket (mcast_linux.go)
	} else {
		pc, err = listenUDP(network, ap)
	}
	if err != nil {
		return nil, err
	}
	rc, err := pc.SyscallConn()
	if err != nil {
		pc.Close()
		return nil, err
	}
	la := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	s := &udpSocket{
		conn:  c,
		pc:    pc,
		local: netip.AddrPortFrom(la.Addr().Unmap(), la.Port()),
		is6:   is6,
		free:  newBatchPool(),
	}
	s.sys.rc = rc
	kgso, kgro := probeOffloads()
	wantGRO := kgro && !cfg.DisableGRO
	var optErr error
	rbuf, sbuf := 0, 0
	err = rc.Control(func(fd uintptr) {
		f := int(fd)
		set := func(level, opt, v int, name string) {
			if optErr == nil {
				if e := unix.SetsockoptInt(f, level, opt, v); e != nil {
					optErr = fmt.Errorf("setsockopt %s: %w", name, e)
				}
			}
		}
		if is6 {
			set(unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO, "IPV6_MTU_DISCOVER")
			set(unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1, "IPV6_RECVPKTINFO")
			set(unix.SOL_UDP, unix.UDP_NO_CHECK6_RX, 1, "UDP_NO_CHECK6_RX")
			set(unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_HOPS, mcastHops, "IPV6_MULTICAST_HOPS")
			// Flow label 0, as rxe's prepare6 writes it (ip6_flow_hdr(ip6h,
			// prio, htonl(0))): a UDP socket otherwise sends a label hashed
			// from the flow (net.ipv6.auto_flowlabels, on by default). Best
			// effort: a kernel or sandbox without the option keeps its
			// labels, which the ICRC masks; auto_flowlabels=3 forces them.
			_ = unix.SetsockoptInt(f, unix.IPPROTO_IPV6, unix.IPV6_AUTOFLOWLABEL, 0)
		} else {
			set(unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO, "IP_MTU_DISCOVER")
			set(unix.IPPROTO_IP, unix.IP_PKTINFO, 1, "IP_PKTINFO")
			set(unix.IPPROTO_IP, unix.IP_MULTICAST_TTL, mcastHops, "IP_MULTICAST_TTL")
		}
		// The multicast TTL too: a datagram to a group whose AV has the
		// default hop limit (64, which sends no per-message TTL:
		// trafficOf) leaves with the socket's multicast TTL, 1 unless
		// set, as the AV's 64 from a sender that never joined the group
		// did (a join's setSendOpts set it on the joining Conn only).
		// Buffer sizes are best effort: the FORCE variants need
		// CAP_NET_ADMIN and ignore rmem_max.
		if unix.SetsockoptInt(f, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, cfg.SocketBufferBytes) != nil {
			_ = unix.SetsockoptInt(f, unix.SOL_SOCKET, unix.SO_RCVBUF, cfg.SocketBufferBytes)
		}
		if unix.SetsockoptInt(f, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, cfg.SocketBufferBytes) != nil {
			_ = unix.SetsockoptInt(f, unix.SOL_SOCKET, unix.SO_SNDBUF, cfg.SocketBufferBytes)
		}
		rbuf, _ = unix.GetsockoptInt(f, unix.SOL_SOCKET, unix.SO_RCVBUF)
		sbuf, _ = unix.GetsockoptInt(f, unix.SOL_SOCKET, unix.SO_SNDBUF)
		// Best effort: the kernel then stamps every datagram with the
		// socket's count of datagrams dropped for a full receive buffer.
		_ = unix.SetsockoptInt(f, unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1)
		if wantGRO {
			s.sys.gro = unix.SetsockoptInt(f, unix.SOL_UDP, unix.UDP_GRO, 1) == nil
		}
		// A socket bound to a link-local address (with its zone) sends to
		// link-local destinations, which come without one, on that
		// interface: the sockaddr's scope id says so (the kernel would
		// also take the bound device for a scope id 0).
		if sa, e := unix.Getsockname(f); e == nil {
			if sa6, ok := sa.(*unix.SockaddrInet6); ok && netip.AddrFrom16(sa6.Addr).IsLinkLocalUnicast() {
				s.sys.scope = sa6.ZoneId
			}
		}
	})
	if err == nil {
		err = optErr
	}
	if err != nil {
		pc.Close()
		return nil, err
	}
	if is6 && ap.Addr().IsUnspecified() {
		// Opened here, in the socket's network namespace (scope_linux.go).
		// A sandbox that refuses netlink sockets (a seccomp profile,
		// gVisor) costs only link-local destinations, which then fail as
		// they would without it; the socket serves everything else.
		s.sys.scopes, _ = openScopeFinder()
	}
	raw, err := newRawSocket(pc)
	if err != nil {
		s.sys.closeScopes()
		return nil, err
	}
	s.pc = nil
	s.sys.rc, s.sys.raw = raw, raw
	s.sys.gso.Store(kgso && !cfg.DisableGSO)
	s.slotSz = MaxDatagramSize
	if s.sys.gro {
		s.slotSz = groSlotSize
	}
	s.sys.recvFn = s.sys.recv
	s.sys.hookedFn = s.sys.recvHooked
	s.sys.pollFn = s.sys.recvPolled
	s.sys.sendFn = s.sys.send
	s.sys.allocTx(cfg.BatchSize)
	c.log.Debug("transport: socket open", "local", s.local, "gso", s.sys.gso.Load(), "gro", s.sys.gro,
		"rcvbuf", rbuf, "sndbuf", sbuf, "kernel_gso", kgso, "kernel_gro", kgro)
	return s, nil
}

// cover and uncover are PollLent's and Uncover's (see rawSocket).
func (y *sockSys) cover()   { y.raw.cover() }
func (y *sockSys) uncover() { y.raw.Uncover() }

// close closes the socket.
func (s *udpSocket) close() error {
	defer noteClosed(s.local)
	err := s.sys.raw.Close()
	// After the socket: a send waiting in it under txMu is woken first.
	s.sys.txMu.Lock()
	s.sys.closeScopes()
	s.sys.txMu.Unlock()
	return err
}

func (y *sockSys) closeScopes() {
	if y.scopes != nil {
		y.scopes.close()
	}
}

// waitClosed returns once the socket is closed in the kernel (rawSocket).
func (s *udpSocket) waitClosed() { s.sys.raw.WaitClosed() }

func sockaddrToAddrPort(sa *unix.RawSockaddrInet6) netip.AddrPort {
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		p := (*[2]byte)(unsafe.Pointer(&sa4.Port))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), binary.BigEndian.Uint16(p[:]))
	case unix.AF_INET6:
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), binary.BigEndian.Uint16(p[:]))
	}
	return netip.AddrPort{}
}

func (y *sockSys) setName(to netip.AddrPort, is6 bool) {
	y.txName = unix.RawSockaddrInet6{}
	if is6 {
		y.txName.Family = unix.AF_INET6
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&y.txName.Port))[:], to.Port())
		y.txName.Addr = to.Addr().As16()
		if y.scope != 0 && to.Addr().IsLinkLocalUnicast() {
			y.txName.Scope_id = y.scope
		}
		y.txNameN = unix.SizeofSockaddrInet6
		return
	}
	sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(&y.txName))
	sa4.Family = unix.AF_INET
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa4.Port))[:], to.Port())
	sa4.Addr = to.Addr().As4()
	y.txNameN = unix.SizeofSockaddrInet4
}
