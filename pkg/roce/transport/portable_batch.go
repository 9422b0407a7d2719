package transport

import (
	"errors"
	"net"
	"net/netip"
	"sync"
)

// The portable path: a plain net.UDPConn, one datagram per system call,
// no offloads, and the destination address of a received packet is the
// address the socket is bound to (bind specific addresses). Systems other
// than Linux use it (udp_other.go); it carries no build tag so that the
// Linux tests drive it against a real loopback socket
// (portable_batch_test.go), since nothing else here runs it. Linux's own
// path (udp_linux.go) does not go through it.

// datagramWriter is what the portable path sends through: the socket's
// net.UDPConn, or in a test a wrapper of it that closes it mid-batch.
type datagramWriter interface {
	WriteToUDPAddrPort(b []byte, addr netip.AddrPort) (int, error)
}

// portableTx is the portable path's send state.
type portableTx struct {
	txMu    sync.Mutex
	w       datagramWriter // nil: the socket's pc
	scratch []byte         // a Gather datagram joined (under txMu)
}

// openPortableSocket binds ap with net.ListenUDP and sizes its buffers
// (best effort: nothing else is set).
func openPortableSocket(c *udpConn, ap netip.AddrPort, cfg *UDPConfig) (*udpSocket, error) {
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

// closePortable closes the socket.
func (s *udpSocket) closePortable() error {
	defer noteClosed(s.local)
	return s.pc.Close()
}

// readPortable reads one datagram into buf (at least slotSz+1 bytes: the
// byte more than the largest datagram detects oversize ones) and makes it
// b's only message.
func (s *udpSocket) readPortable(b *rxBatch, buf []byte) (int, error) {
	n, from, err := s.pc.ReadFromUDPAddrPort(buf)
	if err != nil {
		return 0, err
	}
	m := &b.msgs[0]
	m.data = buf[:n]
	m.trunc = n > s.slotSz
	m.remote = netip.AddrPortFrom(GIDAddr(from.Addr()), from.Port())
	m.local = s.addr
	m.segSize = 0
	return 1, nil
}

// readHookedPortable is readBatchHooked for the portable path: it holds
// the locks across the blocking read, as the socket is not polled there
// (pollBatch finds nothing), so nobody waits for them.
func (s *udpSocket) readHookedPortable(b *rxBatch, buf []byte, hold func() bool, release func()) (int, bool, error) {
	if !hold() {
		return 0, true, nil
	}
	n, err := s.readPortable(b, buf)
	if err != nil {
		release()
		return 0, false, err
	}
	return n, true, nil
}

// writePortable sends bufs, or dgrams (joined in tx's scratch buffer),
// one datagram per system call. A datagram refused does not stop the
// others (as on Linux); the error is a *SendError naming the refused
// ones with the first refusal (a closed socket refuses the rest, and is
// the error reported), and sent and sentBytes count those that went.
func (s *udpSocket) writePortable(tx *portableTx, bufs [][]byte, dgrams []Gather, to netip.AddrPort) (sent int, sentBytes uint64, err error) {
	tx.txMu.Lock()
	defer tx.txMu.Unlock()
	w := tx.w
	if w == nil {
		w = s.pc
	}
	// A link-local destination comes without a zone (a GID has none): it
	// is on the interface the socket is bound to.
	if z := s.local.Addr().Zone(); z != "" && to.Addr().IsLinkLocalUnicast() && to.Addr().Zone() == "" {
		to = netip.AddrPortFrom(to.Addr().WithZone(z), to.Port())
	}
	total := len(bufs) + len(dgrams) // one of them is empty
	var rf refusals
	// one sends datagram i, b; false: the socket is closed.
	one := func(i int, b []byte) bool {
		_, err := w.WriteToUDPAddrPort(b, to)
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
		b := dgrams[i].AppendTo(tx.scratch[:0])
		tx.scratch = b
		if !one(i, b) {
			return sent, sentBytes, rf.err()
		}
	}
	return sent, sentBytes, rf.err()
}
