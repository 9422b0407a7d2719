package transport

import (
	"errors"
	"net"
	"net/netip"
)

// RoCEv2Port is the IANA UDP destination port of RoCEv2.
const RoCEv2Port = 4791

// DefaultBatchSize is the number of datagrams a Conn moves per call unless
// configured otherwise. 64 matches what sendmmsg/recvmmsg amortise well
// without holding much memory per socket.
const DefaultBatchSize = 64

// MaxDatagramSize is the largest UDP payload any Conn carries. RoCE packets
// are at most 4096 bytes of payload plus headers; the limit leaves room for
// jumbo frames while keeping receive buffers small.
const MaxDatagramSize = 9216

// Endpoint names both ends of a datagram.
//
// On receive, Local is the address and port the datagram was sent to and
// Remote the sender. On send, Local selects the source address (and must be
// either the zero AddrPort, an address with port 0, or one of LocalAddrs) and
// Remote is the destination. Both are compared after Unmap, so IPv4-mapped
// IPv6 addresses (the form of a RoCE v2 IPv4 GID) are accepted.
//
// Endpoints carry no zone, as GIDs do not: a Conn bound to an IPv6
// link-local address (fe80::1%eth0, as LocalAddrs lists it) reports
// fe80::1 on receive, accepts fe80::1 (or the zoned form) as Local on
// send, and sends to a link-local Remote on the interface it is bound to.
// One bound to :: (on Linux) sends to a link-local Remote on the
// interface that has Local's address.
//
// TrafficClass and HopLimit are the IP header's IPv4 TOS and TTL (IPv6
// traffic class and hop limit). On send, the datagrams carry them, as
// rdma_rxe puts an address vector's into every packet of a QP: 0 and 0
// (or DefaultHopLimit) are the socket's own (TOS 0, TTL 64) and cost
// nothing; other values are set per message (on Linux IP_TOS / IP_TTL or
// IPV6_TCLASS / IPV6_HOPLIMIT control messages; the portable path
// ignores them, the in-memory network carries them to its receivers).
// The ICRC masks both fields. On receive they are 0 unless the Conn
// reports them (TrafficReporter: udpConn on Linux and MemNetwork's).
//
// FlowLabel is the IPv6 header's flow label (20 bits), reported on
// receive as TrafficClass is (on Linux an IPV6_FLOWINFO control
// message), since a UD receive's GRH holds the received IPv6 header
// whole, as rxe copies it; 0 over IPv4. Sends ignore it: rxed's IPv6
// datagrams leave with flow label 0, as rxe's prepare6 writes them
// (udp_linux.go turns the kernel's automatic labels off). The in-memory
// network alone carries a sender's FlowLabel to its IPv6 receivers, so
// that tests can craft one.
type Endpoint struct {
	Local, Remote          netip.AddrPort
	TrafficClass, HopLimit uint8
	FlowLabel              uint32
}

// GIDAddr is a in the form GIDs and Endpoints carry addresses: an IPv4
// address unmapped, and no zone (a GID is 16 bytes; the interface of a
// link-local address is the bound socket's business).
func GIDAddr(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// Conn is a batched datagram transport.
//
// Buffer ownership: the caller owns every buffer it passes. Receive copies
// datagrams into bufs[i][:sizes[i]] and keeps no reference to bufs after it
// returns; Send reads bufs during the call only, so the caller may reuse them
// as soon as Send returns. Wrappers that must keep a datagram (delay,
// reordering, in-memory queues) copy it into memory of their own.
type Conn interface {
	// Receive blocks until at least one datagram is available, then fills up
	// to len(bufs) of them: datagram i is bufs[i][:sizes[i]], received on
	// eps[i]. sizes and eps must be at least as long as bufs. A datagram
	// longer than its buffer is dropped (and counted where the
	// implementation keeps counters), never truncated, because a truncated
	// RoCE packet is useless. After Close it returns an error for which
	// errors.Is(err, net.ErrClosed) holds, promptly, also to a caller that
	// was already blocked. Calls may come from several goroutines; they are
	// serialised.
	Receive(bufs [][]byte, sizes []int, eps []Endpoint) (n int, err error)

	// Send transmits each of bufs as one datagram from ep.Local to
	// ep.Remote. It is safe for concurrent use. Like UDP, success means the
	// datagrams were handed on, not that they arrive. A datagram the
	// network refuses (longer than the path MTU) does not hold back the
	// others: they are sent, and the error is the first refusal, a
	// *SendError telling how many were not sent (Refused).
	Send(bufs [][]byte, ep Endpoint) error

	// BatchSize is the number of datagrams the Conn prefers per call; larger
	// batches are accepted and split.
	BatchSize() int

	// LocalAddrs lists the addresses and ports the Conn receives on, with
	// the actual port when an ephemeral one was requested.
	LocalAddrs() []netip.AddrPort

	// Close releases the Conn and wakes blocked Receive calls. Closing twice
	// returns net.ErrClosed.
	Close() error
}

// CloseWaiter is implemented by Conns whose sockets can outlive Close for
// a moment: a goroutine other than the Conn's own (a poller, Poller; a
// send) may be in a system call on a socket when Close runs, and the
// socket is closed when that call ends, not before (a descriptor number
// must not be reused under it). Until then its address cannot be bound
// again. WaitClosed, called after Close, returns once every socket of the
// Conn is closed. Engine.Close calls it, so that a device closed and
// opened again on the same address does not fail with "address already in
// use" (the engines of one process poll each other: ProgressOthers).
type CloseWaiter interface {
	WaitClosed()
}

// ErrNoLocalAddr is returned by Send when ep.Local names no address the Conn
// has, or when the Conn has no address of ep.Remote's family.
var ErrNoLocalAddr = errors.New("transport: no local address for endpoint")

// ErrTooLarge is returned by Send for a datagram longer than MaxDatagramSize.
var ErrTooLarge = errors.New("transport: datagram too large")

// errClosed wraps net.ErrClosed so that errors.Is(err, net.ErrClosed) holds
// for every Conn in this package.
var errClosed = net.ErrClosed

// checkRecvArgs validates Receive's slices once so the implementations can
// index without bounds surprises.
func checkRecvArgs(bufs [][]byte, sizes []int, eps []Endpoint) error {
	if len(sizes) < len(bufs) || len(eps) < len(bufs) {
		return errors.New("transport: Receive: sizes and eps must be as long as bufs")
	}
	return nil
}
