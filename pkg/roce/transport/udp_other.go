//go:build !linux

package transport

import (
	"errors"
	"net"
	"net/netip"
	"sync"
)

// Elsewhere the transport is a plain net.UDPConn: one datagram per system
// call, no offloads, and the destination address of a received packet is the
// address the socket is bound to (bind specific addresses).

type rxBatchSys struct {
	buf []byte
}

type sockSys struct {
	txMu    sync.Mutex
	scratch []byte // a Gather datagram joined (under txMu)
}

func openSocket(c *udpConn, ap netip.AddrPort, cfg *UDPConfig) (*udpSocket, error) {
	network := "udp4"
	if ap.Addr().Is6() {
		network = "udp6"
	}
	pc, err := listenUDP(network, ap)
	if err != nil {
		return nil, err
	}
	_ = pc.SetReadBuffer(cfg.SocketBufferBytes)
	_ = pc.SetWriteBuffer(cfg.SocketBufferBytes)
	la := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	return &udpSocket{
		conn:   c,
		pc:     pc,
		local:  netip.AddrPortFrom(la.Addr().Unmap(), la.Port()),
		is6:    ap.Addr().Is6(),
		free:   newBatchPool(),
		slotSz: MaxDatagramSize,
	}, nil
}

// cover and uncover: nothing to do, a net.UDPConn cannot be polled.
func (y *sockSys) cover()   {}
func (y *sockSys) uncover() {}

// close closes the socket.
func (s *udpSocket) close() error {
	defer noteClosed(s.local)
	return s.pc.Close()
}

// waitClosed: nothing to wait for, as nothing but the Conn's own
// goroutines uses the socket here (canPollSockets is false).
func (s *udpSocket) waitClosed() {}

func newRxBatch(s *udpSocket, _ int) *rxBatch {
	// One byte more than the largest datagram detects oversize ones.
	return &rxBatch{sock: s, msgs: make([]rxMsg, 1), sys: rxBatchSys{buf: make([]byte, s.slotSz+1)}}
}

func (s *udpSocket) readBatch(b *rxBatch) (int, error) {
	n, from, err := s.pc.ReadFromUDPAddrPort(b.sys.buf)
	if err != nil {
		return 0, err
	}
	m := &b.msgs[0]
	m.data = b.sys.buf[:n]
	m.trunc = n > s.slotSz
	m.remote = netip.AddrPortFrom(GIDAddr(from.Addr()), from.Port())
	m.local = s.addr
	m.segSize = 0
	return 1, nil
}

// readBatchHooked holds the locks across the blocking read: elsewhere the
// socket is not polled (pollBatch finds nothing), so nobody waits for them.
func (s *udpSocket) readBatchHooked(b *rxBatch, hold func() bool, release func()) (int, bool, error) {
	if !hold() {
		return 0, true, nil
	}
	n, err := s.readBatch(b)
	if err != nil {
		release()
		return 0, false, err
	}
	return n, true, nil
}

// pollBatch finds nothing: a net.UDPConn cannot be read without waiting.
func (s *udpSocket) pollBatch(*rxBatch) (int, error) { return 0, nil }

// writeBatch sends bufs, or dgrams (joined in a scratch buffer), one
// datagram per system call. A datagram refused does not stop the others
// (as on Linux); the error is a *SendError naming the refused ones with
// the first refusal (a closed socket refuses the rest, and is the error
// reported), and sent and sentBytes count those that went.
func (s *udpSocket) writeBatch(bufs [][]byte, dgrams []Gather, to netip.AddrPort, _ netip.Addr) (sent int, sentBytes uint64, err error) {
	s.sys.txMu.Lock()
	defer s.sys.txMu.Unlock()
	// A link-local destination comes without a zone (a GID has none): it
	// is on the interface the socket is bound to.
	if z := s.local.Addr().Zone(); z != "" && to.Addr().IsLinkLocalUnicast() && to.Addr().Zone() == "" {
		to = netip.AddrPortFrom(to.Addr().WithZone(z), to.Port())
	}
	total := len(bufs) + len(dgrams) // one of them is empty
	var rf refusals
	// one sends datagram i, b; false: the socket is closed.
	one := func(i int, b []byte) bool {
		_, err := s.pc.WriteToUDPAddrPort(b, to)
		switch {
		case errors.Is(err, net.ErrClosed):
			rf.add(i, total-i, err)
			rf.first = err
			return false
		case err != nil:
			rf.add(i, 1, err)
		default:
			sent++
			sentBytes += uint64(len(b))
		}
		return true
	}
	for i, b := range bufs {
		if !one(i, b) {
			return sent, sentBytes, rf.err()
		}
	}
	for i := range dgrams {
		b := dgrams[i].AppendTo(s.sys.scratch[:0])
		s.sys.scratch = b
		if !one(i, b) {
			return sent, sentBytes, rf.err()
		}
	}
	return sent, sentBytes, rf.err()
}

// canPollSockets: a net.UDPConn cannot be read without waiting.
const canPollSockets = false
