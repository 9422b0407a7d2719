package transport

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
)

// DefaultMemQueueLen is the number of datagrams a MemNetwork Conn queues
// before it drops, standing in for a socket receive buffer.
const DefaultMemQueueLen = 4096

// MemNetwork delivers datagrams between Conns of one process without
// sockets. Delivery is synchronous and in send order, so a test driving
// several engines over it is deterministic: Send copies each datagram into
// the destination's bounded queue (dropping and counting it when the queue
// is full or nobody listens, as UDP would) and Receive copies it out.
type MemNetwork struct {
	// QueueLen is the per-Conn queue length used by later Listen calls;
	// zero means DefaultMemQueueLen.
	QueueLen int

	mu       sync.Mutex
	conns    map[netip.AddrPort]*memConn
	nextPort uint16

	groups memGroups // multicast membership (mcast.go)
}

// NewMemNetwork returns an empty in-memory network.
func NewMemNetwork() *MemNetwork {
	return &MemNetwork{conns: make(map[netip.AddrPort]*memConn), nextPort: 49152}
}

// Listen attaches a Conn at addr. Port 0 picks an unused port (deterministic:
// counting up from 49152). The address must be specified (not 0.0.0.0/::)
// because the engine needs the exact local address for the ICRC.
func (n *MemNetwork) Listen(addr netip.AddrPort) (Conn, error) {
	a := addr.Addr().Unmap()
	if !a.IsValid() || a.IsUnspecified() {
		return nil, fmt.Errorf("transport: MemNetwork.Listen %v: need a specific address", addr)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	port := addr.Port()
	if port == 0 {
		for i := 0; ; i++ {
			if i == 1<<16 {
				return nil, errors.New("transport: MemNetwork: no free port")
			}
			p := n.nextPort
			n.nextPort++
			if n.nextPort == 0 {
				n.nextPort = 49152
			}
			if _, used := n.conns[netip.AddrPortFrom(a, p)]; !used && p != 0 {
				port = p
				break
			}
		}
	}
	ap := netip.AddrPortFrom(a, port)
	if _, used := n.conns[ap]; used {
		return nil, fmt.Errorf("transport: MemNetwork.Listen %v: address in use", ap)
	}
	qlen := n.QueueLen
	if qlen <= 0 {
		qlen = DefaultMemQueueLen
	}
	c := &memConn{net: n, local: ap, locals: []netip.AddrPort{ap}, q: newPktQueue(qlen)}
	n.conns[ap] = c
	return c, nil
}

func (n *MemNetwork) lookup(ap netip.AddrPort) *memConn {
	n.mu.Lock()
	c := n.conns[ap]
	n.mu.Unlock()
	return c
}

type memConn struct {
	net    *MemNetwork
	local  netip.AddrPort
	locals []netip.AddrPort
	stats  counters
	q      *pktQueue
	once   sync.Once

	// reporting is set while traffic counts ReportTraffic's users:
	// deliveries then carry the sent TOS and TTL (mem_traffic.go).
	reporting atomic.Bool
	traffic   trafficUsers
}

func (c *memConn) BatchSize() int               { return DefaultBatchSize }
func (c *memConn) LocalAddrs() []netip.AddrPort { return c.locals }
func (c *memConn) Stats() Stats                 { return c.stats.snapshot() }

func (c *memConn) Send(bufs [][]byte, ep Endpoint) error {
	if l := ep.Local; l.Addr().IsValid() && (l.Addr().Unmap() != c.local.Addr() || (l.Port() != 0 && l.Port() != c.local.Port())) {
		return fmt.Errorf("%w: %v", ErrNoLocalAddr, l)
	}
	select {
	case <-c.q.closed:
		return errClosed
	default:
	}
	for _, b := range bufs {
		if len(b) > MaxDatagramSize {
			return ErrTooLarge
		}
	}
	if IsGroup(ep.Remote.Addr()) { // to a multicast group's members (mcast.go)
		c.sendGroup(bufs, ep)
		return nil
	}
	dst := c.net.lookup(netip.AddrPortFrom(ep.Remote.Addr().Unmap(), ep.Remote.Port()))
	if dst == nil {
		c.stats.dropNoRoute.Add(uint64(len(bufs)))
		c.countSent(bufs)
		return nil
	}
	dst.enqueue(bufs, c.local, ep)
	c.countSent(bufs)
	return nil
}

func (c *memConn) countSent(bufs [][]byte) {
	var nb uint64
	for _, b := range bufs {
		nb += uint64(len(b))
	}
	c.stats.sentPackets.Add(uint64(len(bufs)))
	c.stats.sentBytes.Add(nb)
}

func (c *memConn) enqueue(bufs [][]byte, from netip.AddrPort, sent Endpoint) {
	ep := c.arrival(c.local, from, sent)
	for _, b := range bufs {
		if !c.q.push(b, ep) {
			c.stats.dropQueueFull.Add(1)
		}
	}
}

func (c *memConn) Receive(bufs [][]byte, sizes []int, eps []Endpoint) (int, error) {
	if err := checkRecvArgs(bufs, sizes, eps); err != nil {
		return 0, err
	}
	n, nb, over, err := c.q.pop(bufs, sizes, eps)
	c.stats.dropOversize.Add(over)
	c.stats.receivedPackets.Add(uint64(n))
	c.stats.receivedBytes.Add(nb)
	return n, err
}

func (c *memConn) Close() error {
	err := errClosed
	c.once.Do(func() {
		err = nil
		c.q.shutdown(nil, true)
		c.net.groups.leaveAll(c) // mcast.go
		c.net.mu.Lock()
		if c.net.conns[c.local] == c {
			delete(c.net.conns, c.local)
		}
		c.net.mu.Unlock()
	})
	return err
}
