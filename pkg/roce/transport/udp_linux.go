//go:build linux

package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The Linux implementation calls recvmmsg/sendmmsg itself on preallocated
// mmsghdr arrays instead of going through x/net's ipv4/ipv6 ReadBatch: x/net
// allocates a *net.UDPAddr (and its IP slice) for every received message,
// which would break the zero-allocation data path. The technique is the same
// (syscall.RawConn.Read/Write around a non-blocking mmsg call, so Go's
// netpoller does the waiting).

// mmsghdr is struct mmsghdr; Go pads it to the kernel's size on every
// architecture (Msghdr's alignment).
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
}

// rxOOBSize holds an in6_pktinfo and a UDP_GRO cmsg with room to spare.
const rxOOBSize = 128

// groSlotSize is the receive slot size when GRO may coalesce: the largest
// UDP payload of an IP packet.
const groSlotSize = 1 << 16

// Kernel limits for one UDP_SEGMENT send (UDP_MAX_SEGMENTS is 128 on older
// kernels; 64 stays within it and still makes 64 KiB messages for 1 KiB
// datagrams).
const (
	maxGSOSegments = 64
	maxGSOBytes4   = 0xFFFF - 20 - 8
	maxGSOBytes6   = 0xFFFF - 8
)

type rxBatchSys struct {
	hdrs  []mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6 // large enough for either family
	oob   []byte
	bufs  [][]byte
}

type sockSys struct {
	rc  syscall.RawConn
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

	// Send side, under txMu.
	txMu    sync.Mutex
	txHdrs  []mmsghdr
	txIovs  []unix.Iovec
	txSegs  []int // bufs carried by each message
	txOOB   []byte
	txName  unix.RawSockaddrInet6
	txNameN uint32
	txSrc   []byte // the IP(V6)_PKTINFO cmsg selecting the source, or empty
	txSrcB  [64]byte
	txOff   int
	txEnd   int
	txN     int
	txErr   error
	sendFn  func(uintptr) bool
}

// txOOBSpace holds a UDP_SEGMENT and an IP(V6)_PKTINFO control message.
var txOOBSpace = unix.CmsgSpace(2) + unix.CmsgSpace(unix.SizeofInet6Pktinfo)

// offloads is what the running kernel supports, probed once per process.
var offloads struct {
	once     sync.Once
	gso, gro bool
}

func probeOffloads() (gso, gro bool) {
	offloads.once.Do(func() {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return
		}
		defer unix.Close(fd)
		_, err = unix.GetsockoptInt(fd, unix.SOL_UDP, unix.UDP_SEGMENT)
		offloads.gso = err == nil
		offloads.gro = unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1) == nil
	})
	return offloads.gso, offloads.gro
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
		pc, err = net.ListenUDP(network, net.UDPAddrFromAddrPort(ap))
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
		free:  make(chan *rxBatch, MaxLentBatches),
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
		} else {
			set(unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO, "IP_MTU_DISCOVER")
			set(unix.IPPROTO_IP, unix.IP_PKTINFO, 1, "IP_PKTINFO")
		}
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
	})
	if err == nil {
		err = optErr
	}
	if err != nil {
		pc.Close()
		return nil, err
	}
	s.sys.gso.Store(kgso && !cfg.DisableGSO)
	s.slotSz = MaxDatagramSize
	if s.sys.gro {
		s.slotSz = groSlotSize
	}
	s.sys.recvFn = s.sys.recv
	s.sys.hookedFn = s.sys.recvHooked
	s.sys.pollFn = s.sys.recvPolled
	s.sys.sendFn = s.sys.send
	n := cfg.BatchSize
	s.sys.txHdrs = make([]mmsghdr, n)
	s.sys.txIovs = make([]unix.Iovec, len(Gather{})*n)
	s.sys.txSegs = make([]int, n)
	s.sys.txOOB = make([]byte, n*txOOBSpace)
	c.log.Debug("transport: socket open", "local", s.local, "gso", s.sys.gso.Load(), "gro", s.sys.gro,
		"rcvbuf", rbuf, "sndbuf", sbuf, "kernel_gso", kgso, "kernel_gro", kgro)
	return s, nil
}

func newRxBatch(s *udpSocket, batchSize int) *rxBatch {
	slots := batchSize
	if s.sys.gro {
		// Each slot may carry many coalesced datagrams; fewer, larger
		// slots keep memory per socket near that of the plain case.
		slots = max(4, batchSize/4)
	}
	b := &rxBatch{sock: s, msgs: make([]rxMsg, slots)}
	y := &b.sys
	y.hdrs = make([]mmsghdr, slots)
	y.iovs = make([]unix.Iovec, slots)
	y.names = make([]unix.RawSockaddrInet6, slots)
	y.oob = make([]byte, slots*rxOOBSize)
	y.bufs = make([][]byte, slots)
	mem := make([]byte, slots*s.slotSz)
	for i := range slots {
		y.bufs[i] = mem[i*s.slotSz : (i+1)*s.slotSz : (i+1)*s.slotSz]
		y.iovs[i].Base = &y.bufs[i][0]
		y.iovs[i].SetLen(s.slotSz)
		h := &y.hdrs[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&y.names[i]))
		h.Iov = &y.iovs[i]
		h.SetIovlen(1)
		h.Control = &y.oob[i*rxOOBSize]
	}
	return b
}

// readBatch blocks until the socket has data, then receives as many messages
// as are queued (up to the batch's slots) and parses them into b.msgs.
func (s *udpSocket) readBatch(b *rxBatch) (int, error) {
	s.prepareRead(b)
	if err := s.sys.rc.Read(s.sys.recvFn); err != nil {
		return 0, err
	}
	return s.finishRead(b)
}

// readBatchHooked is readBatch for a socket that pollers read too: each
// attempt to take datagrams from the kernel first calls hold, which takes
// the locks that order the socket's receivers and reports whether to go
// on (false: return 0 with the locks held, something else is to be handed
// out first); an attempt that finds nothing calls release before it waits.
// held reports whether the locks are held on return (always, unless err
// comes from waiting: the socket was closed).
func (s *udpSocket) readBatchHooked(b *rxBatch, hold func() bool, release func()) (n int, held bool, err error) {
	s.resetSlots(b)
	y := &s.sys
	y.hold, y.release, y.held = hold, release, false
	y.hookHdrs = b.sys.hdrs // rxHdrs is the pollers' too: set under the locks
	err = y.rc.Read(y.hookedFn)
	y.hold, y.release, y.hookHdrs = nil, nil, nil
	if err != nil || !y.held {
		return 0, false, err
	}
	if y.skipped {
		return 0, true, nil
	}
	n, err = s.finishRead(b)
	return n, true, err
}

// pollBatch receives into b what the kernel has queued, without waiting:
// 0 when nothing is. The caller serialises it with the socket's other
// receivers.
func (s *udpSocket) pollBatch(b *rxBatch) (int, error) {
	s.prepareRead(b)
	y := &s.sys
	y.polled = false
	if err := y.rc.Control(y.pollFn); err != nil {
		return 0, err
	}
	if !y.polled {
		return 0, nil
	}
	return s.finishRead(b)
}

// prepareRead points the receive call at b's slots, reset for the kernel.
func (s *udpSocket) prepareRead(b *rxBatch) {
	s.resetSlots(b)
	s.sys.rxHdrs = b.sys.hdrs
}

// resetSlots readies b's slots for the kernel.
func (s *udpSocket) resetSlots(b *rxBatch) {
	y := &b.sys
	for i := range y.hdrs {
		h := &y.hdrs[i].hdr
		h.Namelen = unix.SizeofSockaddrInet6
		h.SetControllen(rxOOBSize)
		h.Flags = 0
		y.hdrs[i].len = 0
	}
}

// finishRead parses what the receive call put into b.
func (s *udpSocket) finishRead(b *rxBatch) (int, error) {
	y := &b.sys
	if s.sys.rxErr != nil {
		return 0, os.NewSyscallError("recvmmsg", s.sys.rxErr)
	}
	n := s.sys.rxN
	for i := range n {
		h := &y.hdrs[i]
		m := &b.msgs[i]
		m.data = y.bufs[i][:h.len]
		m.trunc = h.hdr.Flags&unix.MSG_TRUNC != 0
		m.remote = sockaddrToAddrPort(&y.names[i])
		m.local = s.local.Addr()
		m.segSize = 0
		s.parseCmsgs(m, y.oob[i*rxOOBSize:i*rxOOBSize+int(h.hdr.Controllen)])
		if m.segSize > 0 && m.segSize < len(m.data) {
			s.conn.stats.groReceives.Add(1)
		}
	}
	return n, nil
}

// recvHooked is readBatchHooked's attempt (see there).
func (y *sockSys) recvHooked(fd uintptr) bool {
	if !y.hold() {
		y.held, y.skipped = true, true
		return true
	}
	y.rxHdrs = y.hookHdrs
	if y.recv(fd) {
		y.held, y.skipped = true, false
		return true
	}
	y.release()
	return false
}

// recvPolled is pollBatch's attempt.
func (y *sockSys) recvPolled(fd uintptr) { y.polled = y.recv(fd) }

func (y *sockSys) recv(fd uintptr) bool {
	for {
		n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&y.rxHdrs[0])),
			uintptr(len(y.rxHdrs)), unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
			y.rxN, y.rxErr = int(n), nil
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			y.rxN, y.rxErr = 0, e
			return true
		}
	}
}

// parseCmsgs reads the destination address (IP_PKTINFO / IPV6_PKTINFO) and
// the GRO segment size without allocating.
func (s *udpSocket) parseCmsgs(m *rxMsg, oob []byte) {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return
		}
		data := oob[unix.CmsgLen(0):l]
		switch {
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
			// struct in_pktinfo: ifindex, spec_dst, addr (header destination).
			m.local = netip.AddrFrom4([4]byte(data[8:12]))
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			m.local = netip.AddrFrom16([16]byte(data[0:16])).Unmap()
		case h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && len(data) >= 4:
			m.segSize = int(binary.NativeEndian.Uint32(data))
		case h.Level == unix.SOL_SOCKET && h.Type == unix.SO_RXQ_OVFL && len(data) >= 4:
			s.noteOverflow(binary.NativeEndian.Uint32(data))
		}
		next := unix.CmsgSpace(l - unix.CmsgLen(0))
		if next > len(oob) {
			return
		}
		oob = oob[next:]
	}
}

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
		y.txNameN = unix.SizeofSockaddrInet6
		return
	}
	sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(&y.txName))
	sa4.Family = unix.AF_INET
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa4.Port))[:], to.Port())
	sa4.Addr = to.Addr().As4()
	y.txNameN = unix.SizeofSockaddrInet4
}

// setSource prepares the control message that makes a wildcard-bound socket
// send from src (none when src is invalid or unspecified).
func (y *sockSys) setSource(src netip.Addr, is6 bool) {
	y.txSrc = y.txSrcB[:0]
	if !src.IsValid() || src.IsUnspecified() || src.Is6() != is6 {
		return
	}
	b := y.txSrcB[:]
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	if is6 {
		h.Level, h.Type = unix.IPPROTO_IPV6, unix.IPV6_PKTINFO
		h.SetLen(unix.CmsgLen(unix.SizeofInet6Pktinfo))
		clear(b[unix.CmsgLen(0):unix.CmsgSpace(unix.SizeofInet6Pktinfo)])
		a := src.As16()
		copy(b[unix.CmsgLen(0):], a[:]) // in6_pktinfo.ipi6_addr; ifindex 0
		y.txSrc = b[:unix.CmsgSpace(unix.SizeofInet6Pktinfo)]
		return
	}
	h.Level, h.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
	clear(b[unix.CmsgLen(0):unix.CmsgSpace(unix.SizeofInet4Pktinfo)])
	a := src.As4()
	copy(b[unix.CmsgLen(0)+4:], a[:]) // in_pktinfo.ipi_spec_dst: the source address
	y.txSrc = b[:unix.CmsgSpace(unix.SizeofInet4Pktinfo)]
}

// writeBatch sends bufs (or, when bufs is nil, dgrams) to one destination
// with sendmmsg, packing runs of equal-sized datagrams into single
// UDP_SEGMENT messages when GSO is on. A valid from (only for
// wildcard-bound sockets) sets the source address.
func (s *udpSocket) writeBatch(bufs [][]byte, dgrams []Gather, to netip.AddrPort, from netip.Addr) error {
	y := &s.sys
	y.txMu.Lock()
	defer y.txMu.Unlock()
	y.setName(to, s.is6)
	y.setSource(from, s.is6)
	maxGSO := maxGSOBytes4
	if s.is6 {
		maxGSO = maxGSOBytes6
	}
	// IPv4 GSO only towards loopback: when the kernel (or a NIC) segments a
	// UDP GSO message it numbers the IPv4 IDs of the segments 0, 1, 2, …
	// (inet_gso_segment), but the ICRC of each datagram was computed for ID
	// 0, so every datagram after the first would fail the peer's ICRC check.
	// Loopback delivers the message unsegmented to the receiving socket,
	// which never sees an ID. IPv6 has no ID: its segments' headers are
	// identical.
	gso := y.gso.Load() && (s.is6 || to.Addr().IsLoopback())
	src := txSource{bufs: bufs, dgrams: dgrams}
	for src.n() > 0 {
		nm, used := y.pack(&src, gso, maxGSO)
		y.txOff, y.txEnd = 0, nm
		for y.txOff < y.txEnd {
			if err := y.rc.Write(y.sendFn); err != nil {
				return err
			}
			if y.txErr != nil {
				msgGSO := y.txSegs[y.txOff] > 1
				if !msgGSO || !(errors.Is(y.txErr, unix.EIO) || errors.Is(y.txErr, unix.EINVAL)) {
					return os.NewSyscallError("sendmmsg", y.txErr)
				}
				// The kernel or device refused segmentation offload: resend
				// the rest of this call one datagram per message. EIO means
				// the device cannot do it at all (no checksum offload).
				if errors.Is(y.txErr, unix.EIO) {
					y.gso.Store(false)
					s.conn.log.Warn("transport: UDP GSO refused, disabled", "local", s.local, "err", y.txErr)
				}
				gso = false
				done := 0
				for _, k := range y.txSegs[:y.txOff] {
					done += k
				}
				used = done
				break
			}
			for _, k := range y.txSegs[y.txOff : y.txOff+y.txN] {
				if k > 1 {
					s.conn.stats.gsoSends.Add(1)
				}
			}
			y.txOff += y.txN
		}
		src.skip(used)
	}
	return nil
}

// txSource is what writeBatch sends: whole datagrams or Gather ones.
type txSource struct {
	bufs   [][]byte
	dgrams []Gather
}

func (t *txSource) n() int {
	if t.bufs != nil {
		return len(t.bufs)
	}
	return len(t.dgrams)
}

func (t *txSource) len(i int) int {
	if t.bufs != nil {
		return len(t.bufs[i])
	}
	return t.dgrams[i].Len()
}

func (t *txSource) skip(n int) {
	if t.bufs != nil {
		t.bufs = t.bufs[n:]
	} else {
		t.dgrams = t.dgrams[n:]
	}
}

// iovecs points iovs at datagram i's pieces and returns how many it used
// (a datagram of length 0 still takes one, empty, iovec).
func (t *txSource) iovecs(i int, iovs []unix.Iovec) int {
	if t.bufs != nil {
		setIovec(&iovs[0], t.bufs[i])
		return 1
	}
	k := 0
	for _, p := range t.dgrams[i] {
		if len(p) > 0 {
			setIovec(&iovs[k], p)
			k++
		}
	}
	if k == 0 {
		setIovec(&iovs[0], nil)
		k = 1
	}
	return k
}

func setIovec(iov *unix.Iovec, b []byte) {
	iov.Base = nil
	if len(b) > 0 {
		iov.Base = &b[0]
	}
	iov.SetLen(len(b))
}

// pack fills the tx mmsghdrs from src and returns the number of messages
// and of datagrams they carry.
func (y *sockSys) pack(src *txSource, gso bool, maxGSO int) (msgs, used int) {
	const maxPieces = len(Gather{})
	k := 0 // next iovec
	total := src.n()
	for used < total && msgs < len(y.txHdrs) && k+maxPieces <= len(y.txIovs) {
		seg := src.len(used)
		cnt, size := 1, seg
		if gso && seg > 0 {
			for used+cnt < total && k+(cnt+1)*maxPieces <= len(y.txIovs) && cnt < maxGSOSegments {
				l := src.len(used + cnt)
				if l == 0 || l > seg || size+l > maxGSO {
					break
				}
				size += l
				cnt++
				if l < seg {
					break // a shorter datagram can only end a GSO run
				}
			}
		}
		niov := 0
		for j := range cnt {
			niov += src.iovecs(used+j, y.txIovs[k+niov:])
		}
		h := &y.txHdrs[msgs].hdr
		h.Name = (*byte)(unsafe.Pointer(&y.txName))
		h.Namelen = y.txNameN
		h.Iov = &y.txIovs[k]
		h.SetIovlen(niov)
		h.Flags = 0
		oob := y.txOOB[msgs*txOOBSpace : (msgs+1)*txOOBSpace]
		ol := copy(oob, y.txSrc)
		if cnt > 1 {
			ch := (*unix.Cmsghdr)(unsafe.Pointer(&oob[ol]))
			ch.Level = unix.SOL_UDP
			ch.Type = unix.UDP_SEGMENT
			ch.SetLen(unix.CmsgLen(2))
			binary.NativeEndian.PutUint16(oob[ol+unix.CmsgLen(0):], uint16(seg))
			ol += unix.CmsgSpace(2)
		}
		if ol > 0 {
			h.Control = &oob[0]
			h.SetControllen(ol)
		} else {
			h.Control = nil
			h.SetControllen(0)
		}
		y.txSegs[msgs] = cnt
		k += niov
		used += cnt
		msgs++
	}
	return msgs, used
}

func (y *sockSys) send(fd uintptr) bool {
	for {
		n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&y.txHdrs[y.txOff])),
			uintptr(y.txEnd-y.txOff), 0, 0, 0)
		switch e {
		case 0:
			y.txN, y.txErr = int(n), nil
			if n == 0 {
				y.txErr = unix.EIO // never seen; keeps writeBatch from spinning
			}
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			y.txN, y.txErr = 0, e
			return true
		}
	}
}

// noteOverflow folds the kernel's drop counter of this socket (a 32-bit
// running count, SO_RXQ_OVFL) into the Conn's DropRcvbuf.
func (s *udpSocket) noteOverflow(count uint32) {
	if d := count - s.ovfl; d != 0 && d < 1<<31 {
		s.ovfl = count
		s.conn.stats.dropRcvbuf.Add(uint64(d))
	}
}

// canPollSockets: a Linux socket can be read without waiting (recvmmsg
// with MSG_DONTWAIT).
const canPollSockets = true
