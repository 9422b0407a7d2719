//go:build !linux

package transport

import "net/netip"

// Elsewhere the transport is the portable path (portable_batch.go): a
// plain net.UDPConn, one datagram per system call, no offloads; the
// destination address of a received packet is the address the socket is
// bound to (bind specific addresses).

type rxBatchSys struct {
	buf []byte
}

type sockSys struct {
	tx portableTx
}

func openSocket(c *udpConn, ap netip.AddrPort, cfg *UDPConfig) (*udpSocket, error) {
	return openPortableSocket(c, ap, cfg)
}

// cover and uncover: nothing to do, a net.UDPConn cannot be polled.
func (y *sockSys) cover()   {}
func (y *sockSys) uncover() {}

// close closes the socket.
func (s *udpSocket) close() error { return s.closePortable() }

// waitClosed: nothing to wait for, as nothing but the Conn's own
// goroutines uses the socket here (canPollSockets is false).
func (s *udpSocket) waitClosed() {}

func newRxBatch(s *udpSocket, _ int) *rxBatch {
	// One byte more than the largest datagram detects oversize ones.
	return &rxBatch{sock: s, msgs: make([]rxMsg, 1), sys: rxBatchSys{buf: make([]byte, s.slotSz+1)}}
}

func (s *udpSocket) readBatch(b *rxBatch) (int, error) { return s.readPortable(b, b.sys.buf) }

func (s *udpSocket) readBatchHooked(b *rxBatch, hold func() bool, release func()) (int, bool, error) {
	return s.readHookedPortable(b, b.sys.buf, hold, release)
}

// pollBatch finds nothing: a net.UDPConn cannot be read without waiting.
func (s *udpSocket) pollBatch(*rxBatch) (int, error) { return 0, nil }

// writeBatch: the portable path's, which picks the source by the bound
// address (the kernel's choice for a wildcard socket) and sends with the
// socket's TOS and TTL (a net.UDPConn has no per-datagram ones).
func (s *udpSocket) writeBatch(bufs [][]byte, dgrams []Gather, to netip.AddrPort, _ netip.Addr, _ ipTraffic) (sent int, sentBytes uint64, err error) {
	return s.writePortable(&s.sys.tx, bufs, dgrams, to)
}

// canPollSockets: a net.UDPConn cannot be read without waiting.
const canPollSockets = false
