package transport

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
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
	// (IP_PKTINFO), as the ICRC requires, and sends to a link-local
	// destination on ep.Local's interface. Elsewhere the kernel chooses
	// the source of a wildcard socket, so bind specific addresses there.
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
	// class and hops are the IP header's TOS and TTL (IPv6 traffic
	// class and hop limit) while the Conn reports them (ReportTraffic),
	// else 0. Coalesced (GRO) datagrams share them: the kernel's GRO
	// merges only packets whose TOS and TTL agree.
	class, hops uint8
	// flow is the IPv6 flow label while the Conn reports traffic, else
	// 0 (IPv6 GRO merges only packets of one flow label too).
	flow uint32
}

// rxBatch is a set of receive slots owned by one socket. It travels from the
// socket's reader (which fills it) to Receive or ReceiveLent (which copy or
// lend the datagrams out) and back to the socket's free pool once its
// lease is released: by Receive when every datagram is copied out, after
// ReceiveLent when the last lent datagram is released too.
type rxBatch struct {
	sock  *udpSocket
	msgs  []rxMsg // filled part: msgs[:n]
	n     int
	err   error
	lease Lease
	sys   rxBatchSys // platform syscall structures over the same buffers
}

func (b *rxBatch) recycle() { b.sock.free.put(b) }

// udpSocket is one bound socket of a udpConn.
type udpSocket struct {
	conn   *udpConn
	pc     *net.UDPConn
	local  netip.AddrPort // as bound, with the zone of a link-local address
	addr   netip.Addr     // local's address without its zone, as Endpoints carry it
	is6    bool
	free   *batchPool   // the free batches (recycling never blocks)
	made   atomic.Int32 // batches allocated
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

	rxMu      sync.Mutex  // held while datagrams are taken and handed out; guards cur and the cursor
	waitMu    sync.Mutex  // serialises waits on the only socket (they wait without rxMu)
	lockMu    sync.Locker // the waiting receiver's own lock, under waitMu
	holdFn    func() bool // holdForRead, bound once
	releaseFn func()      // releaseRead, bound once
	direct    *udpSocket  // the only socket, read by Receive itself (no reader goroutine)
	cur       *rxBatch
	traffic   trafficUsers // ReportTraffic's users
	curMsg    int          // index of the message being copied out
	curOff    int          // byte offset of the next datagram inside it
}

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
		filled:    make(chan *rxBatch, MaxLentBatches*len(cfg.Addrs)),
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
		s.addr = GIDAddr(s.local.Addr())
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
		c.direct = c.socks[0]
		c.holdFn, c.releaseFn = c.holdForRead, c.releaseRead
		return c, nil
	}
	for _, s := range c.socks {
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
		b := s.getBatch()
		if b == nil {
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

// getBatch returns a free batch, allocating one while fewer than
// MaxLentBatches exist, else waiting for one to be released; nil once the
// Conn is closed.
func (s *udpSocket) getBatch() *rxBatch {
	if b := s.tryGetBatch(); b != nil {
		return b
	}
	return s.free.get(s.conn.closed)
}

// tryGetBatch is getBatch without the wait: nil when every batch is lent.
func (s *udpSocket) tryGetBatch() *rxBatch {
	if b := s.free.tryGet(); b != nil {
		return b
	}
	if s.made.Add(1) <= MaxLentBatches {
		b := newRxBatch(s, s.conn.batchSize)
		b.lease.home = b
		return b
	}
	s.made.Add(-1)
	return nil
}

func (c *udpConn) Receive(bufs [][]byte, sizes []int, eps []Endpoint) (int, error) {
	if err := checkRecvArgs(bufs, sizes, eps); err != nil {
		return 0, err
	}
	if len(bufs) == 0 {
		return 0, nil
	}
	for {
		if err := c.await(noLock{}); err != nil {
			return 0, err
		}
		n := c.drain(bufs, sizes, eps)
		c.rxMu.Unlock()
		if n > 0 {
			return n, nil
		}
	}
}

// ReceiveLent implements Lender: Receive without the copy.
func (c *udpConn) ReceiveLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (int, error) {
	return c.ReceiveLentLocked(pkts, eps, leases, noLock{})
}

// noLock is the caller's lock of a receiver that orders nothing.
type noLock struct{}

func (noLock) Lock()   {}
func (noLock) Unlock() {}

// await waits until c.cur holds datagrams to hand out and returns with mu
// and rxMu held (nothing held on error). With one socket it waits in the
// kernel holding no lock and takes both before it takes datagrams, so
// pollers (PollLent under mu) run meanwhile and arrival order holds; with
// several it waits for a reader goroutine's batch holding both.
func (c *udpConn) await(mu sync.Locker) error {
	if s := c.direct; s != nil {
		return c.awaitSocket(s, mu)
	}
	mu.Lock()
	c.rxMu.Lock()
	fail := func(err error) error {
		c.rxMu.Unlock()
		mu.Unlock()
		return err
	}
	if c.isClosed() {
		return fail(errClosed)
	}
	if c.cur != nil {
		return nil
	}
	var b *rxBatch
	select {
	case b = <-c.filled:
	case <-c.closed:
		return fail(errClosed)
	}
	if err := b.err; err != nil {
		b.err = nil
		b.sock.free.put(b)
		return fail(err)
	}
	c.open(b, b.n)
	return nil
}

// awaitSocket is await for the Conn's only socket.
func (c *udpConn) awaitSocket(s *udpSocket, mu sync.Locker) error {
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	c.lockMu = mu
	defer func() { c.lockMu = nil }()
	for {
		b := s.getBatch()
		if b == nil {
			return errClosed
		}
		n, held, err := s.readBatchHooked(b, c.holdFn, c.releaseFn)
		if !held {
			s.free.put(b)
			return closedErr(err)
		}
		if err == nil && n > 0 {
			c.open(b, n)
			return nil
		}
		s.free.put(b)
		if err == nil && c.isClosed() {
			err = errClosed
		}
		if err != nil {
			c.releaseRead()
			return err
		}
		if c.cur != nil {
			return nil // a poller left datagrams to hand out first
		}
		c.releaseRead()
	}
}

// next returns the next datagram of the current batch (splitting coalesced
// GRO messages at their segment size) and its message, or ok false when
// the batch is used up; truncated messages and datagrams longer than
// MaxDatagramSize are dropped and counted. (A GRO socket's slots hold
// 64 KiB, so the kernel truncates nothing shorter: without this check a
// datagram that a socket without GRO drops as oversize was handed out.)
func (c *udpConn) next() (d []byte, m *rxMsg, ok bool) {
	b := c.cur
	for c.curMsg < b.n {
		m = &b.msgs[c.curMsg]
		if m.trunc {
			c.stats.dropOversize.Add(1)
			c.curMsg++
			continue
		}
		d = m.data[c.curOff:]
		if m.segSize > 0 && len(d) > m.segSize {
			d = d[:m.segSize]
		}
		c.curOff += len(d)
		if c.curOff >= len(m.data) {
			c.curMsg++
			c.curOff = 0
		}
		if len(d) > MaxDatagramSize {
			c.stats.dropOversize.Add(1)
			continue
		}
		return d, m, true
	}
	return nil, nil, false
}

// done lets go of the current batch once it is used up: the Conn's own
// reference on its lease is released (the batch is reused when no lent
// datagram of it is held any more).
func (c *udpConn) done() {
	if b := c.cur; b.n <= c.curMsg {
		c.cur = nil
		b.lease.Release()
	}
}

// lend hands out datagrams of the current batch as views.
func (c *udpConn) lend(pkts [][]byte, eps []Endpoint, leases []*Lease) int {
	b := c.cur
	n := 0
	var nb uint64
	for n < len(pkts) {
		d, m, ok := c.next()
		if !ok {
			break
		}
		pkts[n] = d
		eps[n] = m.endpoint(b.sock.local.Port())
		leases[n] = &b.lease
		nb += uint64(len(d))
		n++
	}
	b.lease.lend(n)
	c.done()
	c.stats.receivedPackets.Add(uint64(n))
	c.stats.receivedBytes.Add(nb)
	return n
}

// drain copies datagrams of the current batch into bufs.
func (c *udpConn) drain(bufs [][]byte, sizes []int, eps []Endpoint) int {
	b := c.cur
	n := 0
	var nb uint64
	for n < len(bufs) {
		d, m, ok := c.next()
		if !ok {
			break
		}
		if len(d) > len(bufs[n]) {
			c.stats.dropOversize.Add(1)
			continue
		}
		sizes[n] = copy(bufs[n], d)
		eps[n] = m.endpoint(b.sock.local.Port())
		nb += uint64(len(d))
		n++
	}
	c.done()
	c.stats.receivedPackets.Add(uint64(n))
	c.stats.receivedBytes.Add(nb)
	return n
}

func (c *udpConn) Send(bufs [][]byte, ep Endpoint) error {
	s, remote, from, err := c.route(ep)
	if err != nil {
		return err
	}
	for _, b := range bufs {
		if len(b) > MaxDatagramSize {
			return ErrTooLarge
		}
	}
	return c.write(s, bufs, nil, remote, from, trafficOf(ep), len(bufs))
}

// write sends the n datagrams of bufs or dgrams and counts those that
// went. When the kernel refused some (or the socket closed
// mid-batch), the others were still sent: they count in SentPackets and
// the error, writeBatch's *SendError, names the rest, so each datagram is
// counted once, sent or refused.
func (c *udpConn) write(s *udpSocket, bufs [][]byte, dgrams []Gather, remote netip.AddrPort, from netip.Addr, tr ipTraffic, n int) error {
	if n == 0 {
		return nil
	}
	sent, sentBytes, err := s.writeBatch(bufs, dgrams, remote, from, tr)
	c.stats.sentPackets.Add(uint64(sent))
	c.stats.sentBytes.Add(sentBytes)
	return err
}

// SendGather implements GatherSender.
func (c *udpConn) SendGather(dgrams []Gather, ep Endpoint) error {
	s, remote, from, err := c.route(ep)
	if err != nil {
		return err
	}
	for i := range dgrams {
		if dgrams[i].Len() > MaxDatagramSize {
			return ErrTooLarge
		}
	}
	return c.write(s, nil, dgrams, remote, from, trafficOf(ep), len(dgrams))
}

// route picks the socket, destination and (for a wildcard-bound socket)
// source address of a send.
func (c *udpConn) route(ep Endpoint) (s *udpSocket, remote netip.AddrPort, from netip.Addr, err error) {
	select {
	case <-c.closed:
		return nil, remote, from, errClosed
	default:
	}
	remote = netip.AddrPortFrom(ep.Remote.Addr().Unmap(), ep.Remote.Port())
	s = c.pick(ep.Local, remote.Addr().Is6())
	if s == nil {
		return nil, remote, from, fmt.Errorf("%w: local %v remote %v", ErrNoLocalAddr, ep.Local, ep.Remote)
	}
	// A wildcard-bound socket sends from the address the caller names
	// (IP_PKTINFO on Linux); the ICRC was computed over it.
	if s.local.Addr().IsUnspecified() {
		from = ep.Local.Addr().Unmap()
	}
	return s, remote, from, nil
}

// pick finds the socket to send from: the one bound to local's address (a
// wildcard-bound socket matches any address of its family), or without a
// local address the first socket of the remote's family.
func (c *udpConn) pick(local netip.AddrPort, remote6 bool) *udpSocket {
	la := GIDAddr(local.Addr())
	for _, s := range c.socks {
		if s.is6 != remote6 {
			continue
		}
		if !la.IsValid() {
			return s
		}
		if la != s.addr && !s.local.Addr().IsUnspecified() {
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

// WaitClosed implements CloseWaiter.
func (c *udpConn) WaitClosed() {
	for _, s := range c.socks {
		s.waitClosed()
	}
}

func (c *udpConn) closeSockets() {
	for _, s := range c.socks {
		s.close()
	}
}
