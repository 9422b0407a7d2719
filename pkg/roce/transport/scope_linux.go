//go:build linux

package transport

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// A socket bound to :: sends from whatever address the engine names
// (IPV6_PKTINFO), and for a link-local one the kernel must also be told
// the interface: the GIDs the engine holds have no zone, and a link-local
// source without one (ipi6_ifindex 0, no scope id) is EINVAL in
// ip6_datagram_send_ctl, or, for a destination alone, a route of the
// kernel's choosing. The interface is the one that has the source
// address, asked of the kernel with RTM_GETADDR on a netlink socket that
// the Conn opens next to the UDP socket: both then belong to the same
// network namespace, whichever thread (and namespace) later sends. (The
// net package's Interfaces asks from the calling thread's namespace, which
// is not the socket's when it was opened in another one, as the tests'
// netns.Do does.) The answer is cached per address; a send that fails
// forgets it, so an address moved to another interface is asked again.

// scopeFinder maps local addresses to their interface index for one
// wildcard-bound IPv6 socket. Used under the socket's txMu.
type scopeFinder struct {
	fd    int // NETLINK_ROUTE socket, -1 once closed
	seq   uint32
	known map[netip.Addr]uint32
	buf   [512]byte
}

// netlinkTimeout bounds the wait for the kernel's answer; it answers
// within the call, so this only keeps a broken socket from holding the
// send side forever.
const netlinkTimeout = time.Second

// openScopeFinder is newScopeFinder; tests replace it with one that
// fails as a sandbox's refusal does.
var openScopeFinder = newScopeFinder

func newScopeFinder() (*scopeFinder, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, os.NewSyscallError("socket netlink", err)
	}
	tv := unix.NsecToTimeval(netlinkTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("setsockopt SO_RCVTIMEO", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("bind netlink", err)
	}
	return &scopeFinder{fd: fd, known: make(map[netip.Addr]uint32)}, nil
}

// index returns the interface index of local address a, 0 when no
// interface has it (or the kernel could not say).
func (f *scopeFinder) index(a netip.Addr) uint32 {
	if i, ok := f.known[a]; ok {
		return i
	}
	i, err := f.ask(a)
	if err != nil {
		return 0
	}
	f.known[a] = i
	return i
}

// forget drops what index knew of a.
func (f *scopeFinder) forget(a netip.Addr) { delete(f.known, a) }

// ask sends one RTM_GETADDR request for a and reads its answer.
func (f *scopeFinder) ask(a netip.Addr) (uint32, error) {
	if f.fd < 0 {
		return 0, errClosed
	}
	f.seq++
	n := putGetAddrRequest(f.buf[:], f.seq, a)
	if err := unix.Sendto(f.fd, f.buf[:n], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, os.NewSyscallError("sendto netlink", err)
	}
	for {
		n, _, err := unix.Recvfrom(f.fd, f.buf[:], 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, os.NewSyscallError("recvfrom netlink", err)
		}
		i, err := parseGetAddrReply(f.buf[:n], f.seq)
		if errors.Is(err, errStaleReply) {
			continue // the answer to an earlier request that timed out
		}
		return i, err
	}
}

func (f *scopeFinder) close() {
	if f.fd >= 0 {
		unix.Close(f.fd)
		f.fd = -1
	}
}

// Netlink message layout (linux/netlink.h, linux/if_addr.h): a 16-byte
// nlmsghdr, then for RTM_GETADDR/RTM_NEWADDR an 8-byte ifaddrmsg and
// route attributes (4-byte rtattr header, data, padding to 4 bytes).
const (
	nlmsgLen      = 0  // u32: the message's length, header included
	nlmsgType     = 4  // u16
	nlmsgFlags    = 6  // u16
	nlmsgSeq      = 8  // u32
	nlmsgHdrLen   = 16 // (pid at 12)
	ifaFamily     = 0  // u8, in ifaddrmsg
	ifaIndex      = 4  // u32, in ifaddrmsg
	ifaddrmsgLen  = 8
	rtaHdrLen     = 4
	getAddrReqLen = nlmsgHdrLen + ifaddrmsgLen + rtaHdrLen + 16
)

// errStaleReply is a netlink message that answers another request.
var errStaleReply = errors.New("transport: netlink reply to another request")

// putGetAddrRequest writes into b (getAddrReqLen bytes at least) the
// RTM_GETADDR request for the one address a (no dump: inet6_rtm_getaddr
// answers with that address's RTM_NEWADDR, or EADDRNOTAVAIL) and returns
// its length. Netlink is host-endian.
func putGetAddrRequest(b []byte, seq uint32, a netip.Addr) int {
	clear(b[:getAddrReqLen])
	ne := binary.NativeEndian
	ne.PutUint32(b[nlmsgLen:], getAddrReqLen)
	ne.PutUint16(b[nlmsgType:], unix.RTM_GETADDR)
	ne.PutUint16(b[nlmsgFlags:], unix.NLM_F_REQUEST)
	ne.PutUint32(b[nlmsgSeq:], seq)
	ifa := b[nlmsgHdrLen:]
	ifa[ifaFamily] = unix.AF_INET6
	rta := ifa[ifaddrmsgLen:]
	ne.PutUint16(rta[0:], rtaHdrLen+16) // rta_len
	ne.PutUint16(rta[2:], unix.IFA_ADDRESS)
	a16 := a.As16()
	copy(rta[rtaHdrLen:], a16[:])
	return getAddrReqLen
}

// parseGetAddrReply reads the kernel's answer to request seq: the
// interface index of an RTM_NEWADDR, the error of an NLMSG_ERROR, or
// errStaleReply for a message of another sequence number.
func parseGetAddrReply(b []byte, seq uint32) (uint32, error) {
	ne := binary.NativeEndian
	if len(b) < nlmsgHdrLen {
		return 0, errors.New("transport: short netlink reply")
	}
	l := ne.Uint32(b[nlmsgLen:])
	if l < nlmsgHdrLen || int(l) > len(b) {
		return 0, errors.New("transport: bad netlink message length")
	}
	b = b[:l]
	if ne.Uint32(b[nlmsgSeq:]) != seq {
		return 0, errStaleReply
	}
	body := b[nlmsgHdrLen:]
	switch ne.Uint16(b[nlmsgType:]) {
	case unix.NLMSG_ERROR:
		if len(body) < 4 {
			return 0, errors.New("transport: short netlink error")
		}
		if e := int32(ne.Uint32(body)); e != 0 {
			return 0, os.NewSyscallError("RTM_GETADDR", unix.Errno(-e))
		}
		return 0, errors.New("transport: netlink acknowledged without an address")
	case unix.RTM_NEWADDR:
		if len(body) < ifaddrmsgLen || body[ifaFamily] != unix.AF_INET6 {
			return 0, errors.New("transport: bad RTM_NEWADDR")
		}
		return ne.Uint32(body[ifaIndex:]), nil
	}
	return 0, errors.New("transport: unexpected netlink message")
}
