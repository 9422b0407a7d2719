package e2e

import (
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The system-call floor of a round trip: the datagrams of an in-process
// RDMA round trip, sent and received by one goroutine with the calls the
// engine makes (sendto, or sendmsg with UDP_SEGMENT for several; recvmmsg
// with MSG_DONTWAIT into GRO-sized slots, with IP_PKTINFO and UDP_GRO on,
// retried until the datagrams are in) and nothing else: no engine, no
// goroutine hand-off. An event-mode round trip in one process runs in one
// goroutine too (ProgressBeforeSleep), so
//
//	floor-p50-ns     the floor's median round trip
//	floor-p50-ratio  the RDMA median / the floor's
//
// say what the engine's Go work adds to the kernel's. (A SEND ping-pong
// whose two applications both spin runs on two CPUs, so its ratio also
// holds the cross-CPU hand-off, which the floor does not have.) On session R's VM
// the floor of an 8-byte WRITE round trip is about 2.6 us against TCP's
// ping-pong of 4.0-4.5 us, so the median goal (<= TCP) leaves the engine
// about 1.5-2 us per round trip (docs/performance.md, session R).

// floorSlots and floorSlotSize are the receive batch of a GRO socket in
// the transport (max(4, DefaultBatchSize/4) slots of a GRO message).
const (
	floorSlots    = 4
	floorSlotSize = 65535
	floorOOB      = 64
)

type floorSock struct {
	fd    int
	ap    netip.AddrPort
	hdrs  []floorMmsghdr
	iovs  []unix.Iovec
	bufs  [][]byte
	names []unix.RawSockaddrInet4
	oob   []byte
	txOOB []byte // a UDP_SEGMENT control message
}

// floorMmsghdr is struct mmsghdr (as the transport's).
type floorMmsghdr struct {
	hdr unix.Msghdr
	len uint32
}

func openFloorSock(b testing.TB, addr netip.Addr) *floorSock {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	require.NoError(b, err)
	b.Cleanup(func() { unix.Close(fd) })
	require.NoError(b, unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO))
	require.NoError(b, unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_PKTINFO, 1))
	require.NoError(b, unix.SetsockoptInt(fd, unix.IPPROTO_UDP, unix.UDP_GRO, 1))
	require.NoError(b, unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.As4()}))
	sa, err := unix.Getsockname(fd)
	require.NoError(b, err)
	s := &floorSock{fd: fd, ap: netip.AddrPortFrom(addr, uint16(sa.(*unix.SockaddrInet4).Port)),
		txOOB: make([]byte, unix.CmsgSpace(2))}
	s.hdrs = make([]floorMmsghdr, floorSlots)
	s.iovs = make([]unix.Iovec, floorSlots)
	s.names = make([]unix.RawSockaddrInet4, floorSlots)
	s.oob = make([]byte, floorSlots*floorOOB)
	for i := range floorSlots {
		s.bufs = append(s.bufs, make([]byte, floorSlotSize))
		s.iovs[i].Base = &s.bufs[i][0]
		s.iovs[i].SetLen(floorSlotSize)
		h := &s.hdrs[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&s.names[i]))
		h.Iov = &s.iovs[i]
		h.SetIovlen(1)
		h.Control = &s.oob[i*floorOOB]
	}
	return s
}

// recv takes what is queued (recvmmsg, MSG_DONTWAIT) and returns the
// bytes received.
func (s *floorSock) recv(b testing.TB) int {
	for i := range s.hdrs {
		s.hdrs[i].hdr.Namelen = unix.SizeofSockaddrInet4
		s.hdrs[i].hdr.SetControllen(floorOOB)
	}
	n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&s.hdrs[0])), uintptr(len(s.hdrs)),
		unix.MSG_DONTWAIT, 0, 0)
	switch e {
	case 0:
	case unix.EAGAIN, unix.EINTR:
		return 0
	default:
		b.Fatalf("recvmmsg: %v", e)
	}
	got := 0
	for i := range int(n) {
		got += int(s.hdrs[i].len)
	}
	return got
}

// send sends the datagrams of dgrams (sizes, largest first) to ap: one
// with sendto, several as one UDP_SEGMENT message.
func (s *floorSock) send(b testing.TB, out []byte, dgrams []int, to netip.AddrPort) {
	sa := &unix.SockaddrInet4{Addr: to.Addr().As4(), Port: int(to.Port())}
	total := 0
	for _, n := range dgrams {
		total += n
	}
	var err error
	if len(dgrams) == 1 {
		err = unix.Sendto(s.fd, out[:total], 0, sa)
	} else {
		oob := s.txOOB
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
		h.SetLen(unix.CmsgLen(2))
		*(*uint16)(unsafe.Pointer(&oob[unix.CmsgLen(0)])) = uint16(dgrams[0])
		_, err = unix.SendmsgN(s.fd, out[:total], oob, sa, 0)
	}
	require.NoError(b, err)
}

// sysFloorRTT is n round trips of the datagrams ping (A to B) and pong (B
// to A) in one goroutine; see the top of the file.
func sysFloorRTT(b testing.TB, n int, ping, pong []int) *rtts {
	a := openFloorSock(b, netip.MustParseAddr("127.0.0.1"))
	c := openFloorSock(b, netip.MustParseAddr("127.0.0.2"))
	out := make([]byte, 1<<16)
	sum := func(d []int) int {
		t := 0
		for _, x := range d {
			t += x
		}
		return t
	}
	pingN, pongN := sum(ping), sum(pong)
	r := newRTTs("floor", n)
	for range n {
		t0 := time.Now()
		a.send(b, out, ping, c.ap)
		for got := 0; got < pingN; {
			got += c.recv(b)
		}
		c.send(b, out, pong, a.ap)
		for got := 0; got < pongN; {
			got += a.recv(b)
		}
		r.add(time.Since(t0))
	}
	return r
}

// reportVsFloor reports the floor's median and the RDMA median's ratio to
// it.
func reportVsFloor(b *testing.B, rdma, floor *rtts) {
	p50, _, _ := rdma.quantiles()
	f50, _, _ := floor.quantiles()
	b.ReportMetric(f50, "floor-p50-ns")
	if f50 > 0 {
		b.ReportMetric(p50/f50, "floor-p50-ratio")
	}
}
