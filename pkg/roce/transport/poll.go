package transport

import (
	"errors"
	"net"
	"sync"
)

// Poller is a Lender that can also be read without waiting, so that a
// goroutine spinning on a completion queue can receive and handle packets
// itself instead of waiting for the goroutine blocked in a receive call
// to be woken, run and hand them over: on loopback those wake-ups are
// most of a round trip. RDMA applications that want low latency poll.
//
// Arrival order across receivers: ReceiveLentLocked waits without any
// lock, and takes the caller's mu before it takes datagrams from the
// kernel, returning with mu held. A caller that calls PollLent only under
// the same mu, and handles what it got before it lets go of mu, sees the
// datagrams in the order they arrived, whoever received them.
type Poller interface {
	Lender
	// PollLent is ReceiveLent that never waits: it returns 0 at once when
	// nothing is queued, when every receive batch is lent out, or when
	// another call is taking datagrams at this moment. It only finds
	// datagrams on a Conn that CanPoll.
	PollLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (n int, err error)
	// ReceiveLentLocked is ReceiveLent for a Conn that is also polled: it
	// returns with mu locked when n > 0 and unlocked on error.
	ReceiveLentLocked(pkts [][]byte, eps []Endpoint, leases []*Lease, mu sync.Locker) (n int, err error)
	// Cover says that a goroutine spins on PollLent: for a moment
	// (on Linux 200 us, renewed by every Cover) the goroutine blocked in
	// ReceiveLentLocked stops waiting on the socket, so that a datagram
	// arriving wakes nobody and the spinner's next PollLent takes it (see
	// rawSocket). Uncover ends the cover at once: the spinner goes to
	// sleep, and the blocked receiver waits on the socket again.
	Cover()
	Uncover()
	// CanPoll reports whether PollLent can find datagrams: on Linux, a
	// Conn of one socket (with more, per-socket reader goroutines
	// receive, and PollLent would only take their batches out of order
	// with ReceiveLentLocked's, so it finds nothing).
	CanPoll() bool
}

// CanPoll implements Poller.
func (c *udpConn) CanPoll() bool { return c.direct != nil && canPollSockets }

// PollLent implements Poller.
func (c *udpConn) PollLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (int, error) {
	if len(eps) < len(pkts) || len(leases) < len(pkts) {
		return 0, errShortLend
	}
	s := c.direct
	if len(pkts) == 0 || s == nil || !c.rxMu.TryLock() {
		return 0, nil
	}
	defer c.rxMu.Unlock()
	if c.isClosed() {
		return 0, errClosed
	}
	if c.cur == nil {
		b := s.tryGetBatch()
		if b == nil {
			return 0, nil
		}
		n, err := s.pollBatch(b)
		if n == 0 || err != nil {
			s.free.put(b)
			return 0, closedErr(err)
		}
		c.open(b, n)
	}
	return c.lend(pkts, eps, leases), nil
}

// Cover implements Poller.
func (c *udpConn) Cover() {
	if s := c.direct; s != nil {
		s.sys.cover()
	}
}

// Uncover implements Poller.
func (c *udpConn) Uncover() {
	if s := c.direct; s != nil {
		s.sys.uncover()
	}
}

// ReceiveLentLocked implements Poller.
func (c *udpConn) ReceiveLentLocked(pkts [][]byte, eps []Endpoint, leases []*Lease, mu sync.Locker) (int, error) {
	if len(eps) < len(pkts) || len(leases) < len(pkts) {
		return 0, errShortLend
	}
	if len(pkts) == 0 {
		return 0, nil
	}
	for {
		if err := c.await(mu); err != nil {
			return 0, err
		}
		n := c.lend(pkts, eps, leases)
		c.rxMu.Unlock()
		if n > 0 {
			return n, nil
		}
		mu.Unlock()
	}
}

// holdForRead takes ReceiveLentLocked's locks before datagrams are taken
// from the kernel; it says no when a poller left datagrams to hand out
// first, or the Conn is closed.
func (c *udpConn) holdForRead() bool {
	c.lockMu.Lock()
	c.rxMu.Lock()
	return c.cur == nil && !c.isClosed()
}

func (c *udpConn) releaseRead() {
	c.rxMu.Unlock()
	c.lockMu.Unlock()
}

// open makes b, just filled with n messages, the batch being handed out.
// Called under rxMu.
func (c *udpConn) open(b *rxBatch, n int) {
	b.n = n
	b.lease.open()
	c.cur, c.curMsg, c.curOff = b, 0, 0
}

func (c *udpConn) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// closedErr reports a read on a closed socket as errClosed.
func closedErr(err error) error {
	if err != nil && errors.Is(err, net.ErrClosed) {
		return errClosed
	}
	return err
}
