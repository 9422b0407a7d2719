package transport

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
)

// DefaultSocketBufferBytes is the SO_RCVBUF/SO_SNDBUF size OpenUDP asks for.
// A RoCE burst (a 64 KiB WRITE is 16 packets at MTU 4096, and many QPs burst
// at once) must not overflow the receive buffer, or the requester pays a
// retransmit timeout.
const DefaultSocketBufferBytes = 4 << 20

// UDPConfig configures OpenUDP.
type UDPConfig struct {
	// Addrs are the local addresses to receive on and send from, IPv4 and/or
	// IPv6, one socket each. At least one is required. A wildcard (0.0.0.0
	// or ::) receives on every address of its family, Endpoint.Local telling
	// which; on Linux, Send then uses ep.Local as the source address
	// (IP_PKTINFO), as the ICRC requires. Elsewhere the kernel chooses the
	// source of a wildcard socket, so bind specific addresses there.
	Addrs []netip.Addr
	// Port is the UDP port of every socket. Zero means an ephemeral port, as
	// for net.ListenUDP (tests); the first socket's port is then reused for
	// the others when free. Use RoCEv2Port (4791) to talk to rdma_rxe.
	Port int
	// Logger receives setup decisions (offloads, buffer sizes); nil is silent.
	Logger *slog.Logger
	// BatchSize is the number of datagrams per system call; zero means
	// DefaultBatchSize.
	BatchSize int
	// SocketBufferBytes sizes SO_RCVBUF and SO_SNDBUF; zero means
	// DefaultSocketBufferBytes.
	SocketBufferBytes int
	// DisableGSO and DisableGRO turn the Linux UDP offloads off, like the
	// environment variables RXED_NO_GSO=1 and RXED_NO_GRO=1.
	DisableGSO, DisableGRO bool
}

// rxMsg is one received message after parsing: data may hold several
// datagrams of segSize bytes each (the last possibly shorter) when the kernel
// coalesced them (UDP GRO); segSize 0 means data is a single datagram.
type rxMsg struct {
	data    []byte
	remote  netip.AddrPort
	local   netip.Addr
	segSize int
	trunc   bool
}

// rxBatch is a set of receive slots owned by one socket. It travels from the
// socket's reader goroutine (which fills it) to Receive (which copies the
// datagrams out) and back through the socket's free channel, so the buffers
// are always owned by exactly one goroutine.
type rxBatch struct {
	sock *udpSocket
	msgs []rxMsg // filled part: msgs[:n]
	n    int
	err  error
	sys  rxBatchSys // platform syscall structures over the same buffers
}

// udpSocket is one bound socket of a udpConn.
type udpSocket struct {
	conn   *udpConn
	pc     *net.UDPConn
	local  netip.AddrPort
	is6    bool
	free   chan *rxBatch
	slotSz int
	sys    sockSys // platform state: raw conn, tx structures, offload flags
}

type udpConn struct {
	log       *slog.Logger
	batchSize int
	socks     []*udpSocket
	locals    []netip.AddrPort
	stats     counters

	filled chan *rxBatch
	closed chan struct{}
	once   sync.Once
	wg     sync.WaitGroup

	rxMu   sync.Mutex // serialises Receive; guards cur, the cursor and direct
	direct *rxBatch   // the only batch when there is one socket (no reader goroutine)
	cur    *rxBatch
	curMsg int // index of the message being copied out
	curOff int // byte offset of the next datagram inside it
}

// rxBatchesPerSocket is how many batches each socket cycles through: the
// reader fills one while Receive drains another.
const rxBatchesPerSocket = 2

// OpenUDP opens one unconnected UDP socket per address in cfg.Addrs and
// returns a Conn over all of them.
//
// On Linux the sockets get IP_MTU_DISCOVER=IP_PMTUDISC_DO (IPv4 packets go out
// with ID 0 and DF, which the sender's ICRC covers), IPV6_MTU_DISCOVER,
// UDP_NO_CHECK6_RX (rdma_rxe sends IPv6 UDP checksum 0), IP_PKTINFO /
// IPV6_RECVPKTINFO, large buffers, and UDP GSO/GRO when the kernel has them.
// Outgoing IPv6 packets carry a real UDP checksum: rdma_rxe's socket accepts
// both, any other IPv6 stack requires it, and GSO refuses UDP_NO_CHECK6_TX.
func OpenUDP(cfg UDPConfig) (Conn, error) {
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("transport: OpenUDP: no addresses")
	}
	if cfg.Port < 0 || cfg.Port > 65535 {
		return nil, fmt.Errorf("transport: OpenUDP: bad port %d", cfg.Port)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.SocketBufferBytes <= 0 {
		cfg.SocketBufferBytes = DefaultSocketBufferBytes
	}
	if os.Getenv("RXED_NO_GSO") == "1" {
		cfg.DisableGSO = true
	}
	if os.Getenv("RXED_NO_GRO") == "1" {
		cfg.DisableGRO = true
	}
	c := &udpConn{
		log:       log,
		batchSize: cfg.BatchSize,
		closed:    make(chan struct{}),
		filled:    make(chan *rxBatch, rxBatchesPerSocket*len(cfg.Addrs)),
	}
	port := cfg.Port
	for i, a := range cfg.Addrs {
		a = a.Unmap()
		if !a.IsValid() {
			c.closeSockets()
			return nil, fmt.Errorf("transport: OpenUDP: invalid address at index %d", i)
		}
		s, err := openSocket(c, netip.AddrPortFrom(a, uint16(port)), &cfg)
		if err != nil && cfg.Port == 0 && port != 0 {
			// The ephemeral port of the first socket is taken for this
			// address; any port will do.
			s, err = openSocket(c, netip.AddrPortFrom(a, 0), &cfg)
		}
		if err != nil {
			c.closeSockets()
			return nil, fmt.Errorf("transport: OpenUDP %v: %w", netip.AddrPortFrom(a, uint16(port)), err)
		}
		if port == 0 {
			port = int(s.local.Port())
		}
		c.socks = append(c.socks, s)
		c.locals = append(c.locals, s.local)
	}
	if len(c.socks) == 1 {
		// One socket: Receive reads it itself, saving the hand-off from a
		// reader goroutine (one wake-up less per datagram burst, which is
		// most of a round trip's overhead on loopback).
		c.direct = newRxBatch(c.socks[0], cfg.BatchSize)
		return c, nil
	}
	for _, s := range c.socks {
		for range rxBatchesPerSocket {
			s.free <- newRxBatch(s, cfg.BatchSize)
		}
		c.wg.Add(1)
		go s.readLoop()
	}
	return c, nil
}

func (c *udpConn) BatchSize() int               { return c.batchSize }
func (c *udpConn) LocalAddrs() []netip.AddrPort { return c.locals }
func (c *udpConn) Stats() Stats                 { return c.stats.snapshot() }

// readLoop is the reader goroutine of one socket: it fills free batches and
// hands them to Receive through c.filled.
func (s *udpSocket) readLoop() {
	c := s.conn
	defer c.wg.Done()
	for {
		var b *rxBatch
		select {
		case b = <-s.free:
		case <-c.closed:
			return
		}
		n, err := s.readBatch(b)
		if err != nil && errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			c.log.Warn("transport: receive error", "local", s.local, "err", err)
		}
		b.n, b.err = n, err
		select {
		case c.filled <- b: // b belongs to Receive from here on
		case <-c.closed:
			return
		}
	}
}

func (c *udpConn) Receive(bufs [][]byte, sizes []int, eps []Endpoint) (int, error) {
	if err := checkRecvArgs(bufs, sizes, eps); err != nil {
		return 0, err
	}
	if len(bufs) == 0 {
		return 0, nil
	}
	c.rxMu.Lock()
	defer c.rxMu.Unlock()
	for {
		select {
		case <-c.closed:
			return 0, errClosed
		default:
		}
		if c.cur == nil && c.direct != nil {
			b := c.direct
			n, err := b.sock.readBatch(b)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return 0, errClosed
				}
				return 0, err
			}
			b.n = n
			c.cur, c.curMsg, c.curOff = b, 0, 0
		}
		if c.cur == nil {
			select {
			case b := <-c.filled:
				if b.err != nil {
					err := b.err
					b.err = nil
					b.sock.free <- b
					return 0, err
				}
				c.cur, c.curMsg, c.curOff = b, 0, 0
			case <-c.closed:
				return 0, errClosed
			}
		}
		n := c.drain(bufs, sizes, eps)
		if n > 0 {
			return n, nil
		}
	}
}

// drain copies datagrams of the current batch into bufs, splitting coalesced
// (GRO) messages at their segment size, and recycles the batch when done.
func (c *udpConn) drain(bufs [][]byte, sizes []int, eps []Endpoint) int {
	b := c.cur
	n := 0
	var nb uint64
	for n < len(bufs) && c.curMsg < b.n {
		m := &b.msgs[c.curMsg]
		if m.trunc {
			c.stats.dropOversize.Add(1)
			c.curMsg++
			continue
		}
		d := m.data[c.curOff:]
		if m.segSize > 0 && len(d) > m.segSize {
			d = d[:m.segSize]
		}
		c.curOff += len(d)
		if c.curOff >= len(m.data) {
			c.curMsg++
			c.curOff = 0
		}
		if len(d) > len(bufs[n]) {
			c.stats.dropOversize.Add(1)
			continue
		}
		sizes[n] = copy(bufs[n], d)
		eps[n] = Endpoint{Local: netip.AddrPortFrom(m.local, b.sock.local.Port()), Remote: m.remote}
		nb += uint64(len(d))
		n++
	}
	if c.curMsg >= b.n {
		c.cur = nil
		if b != c.direct {
			b.sock.free <- b
		}
	}
	c.stats.receivedPackets.Add(uint64(n))
	c.stats.receivedBytes.Add(nb)
	return n
}

func (c *udpConn) Send(bufs [][]byte, ep Endpoint) error {
	select {
	case <-c.closed:
		return errClosed
	default:
	}
	remote := netip.AddrPortFrom(ep.Remote.Addr().Unmap(), ep.Remote.Port())
	s := c.pick(ep.Local, remote.Addr().Is6())
	if s == nil {
		return fmt.Errorf("%w: local %v remote %v", ErrNoLocalAddr, ep.Local, ep.Remote)
	}
	var nb uint64
	for _, b := range bufs {
		if len(b) > MaxDatagramSize {
			return ErrTooLarge
		}
		nb += uint64(len(b))
	}
	if len(bufs) == 0 {
		return nil
	}
	// A wildcard-bound socket sends from the address the caller names
	// (IP_PKTINFO on Linux); the ICRC was computed over it.
	var from netip.Addr
	if s.local.Addr().IsUnspecified() {
		from = ep.Local.Addr().Unmap()
	}
	if err := s.writeBatch(bufs, remote, from); err != nil {
		return err
	}
	c.stats.sentPackets.Add(uint64(len(bufs)))
	c.stats.sentBytes.Add(nb)
	return nil
}

// pick finds the socket to send from: the one bound to local's address (a
// wildcard-bound socket matches any address of its family), or without a
// local address the first socket of the remote's family.
func (c *udpConn) pick(local netip.AddrPort, remote6 bool) *udpSocket {
	la := local.Addr().Unmap()
	for _, s := range c.socks {
		if s.is6 != remote6 {
			continue
		}
		if !la.IsValid() {
			return s
		}
		if la != s.local.Addr() && !s.local.Addr().IsUnspecified() {
			continue
		}
		if local.Port() != 0 && local.Port() != s.local.Port() {
			continue
		}
		return s
	}
	return nil
}

func (c *udpConn) Close() error {
	err := errClosed
	c.once.Do(func() {
		err = nil
		close(c.closed)
		c.closeSockets()
		c.wg.Wait()
	})
	return err
}

func (c *udpConn) closeSockets() {
	for _, s := range c.socks {
		s.pc.Close()
	}
}
