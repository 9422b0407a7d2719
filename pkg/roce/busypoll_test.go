package roce

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// countingPoller counts the datagrams a pollable Conn hands out by a
// blocking receive and by a poll.
type countingPoller struct {
	transport.Conn
	p                transport.Poller
	blocking, polled atomic.Int64
	blockingBatches  atomic.Int64
}

func (c *countingPoller) ReceiveLent(pkts [][]byte, eps []transport.Endpoint, leases []*transport.Lease) (int, error) {
	n, err := c.p.ReceiveLent(pkts, eps, leases)
	c.noteBlocking(n)
	return n, err
}

func (c *countingPoller) ReceiveLentLocked(pkts [][]byte, eps []transport.Endpoint, leases []*transport.Lease, mu sync.Locker) (int, error) {
	n, err := c.p.ReceiveLentLocked(pkts, eps, leases, mu)
	c.noteBlocking(n)
	return n, err
}

func (c *countingPoller) noteBlocking(n int) {
	if n > 0 {
		c.blocking.Add(int64(n))
		c.blockingBatches.Add(1)
	}
}

func (c *countingPoller) PollLent(pkts [][]byte, eps []transport.Endpoint, leases []*transport.Lease) (int, error) {
	n, err := c.p.PollLent(pkts, eps, leases)
	c.polled.Add(int64(n))
	return n, err
}

func (c *countingPoller) Cover()        { c.p.Cover() }
func (c *countingPoller) Uncover()      { c.p.Uncover() }
func (c *countingPoller) CanPoll() bool { return c.p.CanPoll() }

// TestBusyPollReceivesByPolling: with Config.BusyPoll the receive
// goroutine polls the socket after a batch instead of blocking at once
// (busypoll.go): with a BusyPoll longer than the test, the responder's
// engine takes one batch by a blocking receive and every later datagram
// by polling, although nobody calls Progress; Close still stops it.
// Without BusyPoll nothing is polled.
func TestBusyPollReceivesByPolling(t *testing.T) {
	for _, busy := range []time.Duration{0, time.Hour} {
		a := newUDPSide(t, "127.0.0.1", false)
		uc, err := transport.OpenUDP(transport.UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
		require.NoError(t, err)
		p, ok := uc.(transport.Poller)
		require.True(t, ok && p.CanPoll(), "a one-socket UDP Conn can be polled here")
		cp := &countingPoller{Conn: uc, p: p}
		b := sideWith(t, Config{Conn: cp, Workers: 2, IBATimerOnly: true, BusyPoll: busy}, netip.MustParseAddr("127.0.0.1"), qp.RC, sideCap)
		connectUDP(t, a, b)
		amr, abuf := regMR(t, a, 4096)
		bmr, bbuf := regMR(t, b, 4096)

		// WRITEs one at a time: each waits for its ACK, so b's socket
		// is empty between them and b's receive goroutine must either
		// poll or block again for the next.
		const writes = 50
		for i := range writes {
			abuf[i] = byte(i + 1)
			_, err := a.e.PostSend(a.q, []qp.SendWR{{ID: uint64(i), Opcode: qp.WRRDMAWrite, Flags: qp.Signaled,
				SGL: []qp.SGE{{Addr: amr.IOVA() + uint64(i), Length: 1, LKey: amr.LKey()}}, RemoteAddr: bmr.IOVA() + uint64(i), RKey: bmr.RKey()}})
			require.NoError(t, err)
			wc := waitWC(t, a.scq)
			require.Equal(t, qp.WCSuccess, wc.Status)
		}
		got := cp.blocking.Load() + cp.polled.Load()
		require.EqualValues(t, writes, got, "busy %v: b received every WRITE once", busy)
		if busy == 0 {
			require.Zero(t, cp.polled.Load(), "without BusyPoll nobody polls")
			require.EqualValues(t, writes, cp.blocking.Load())
		} else {
			require.EqualValues(t, 1, cp.blockingBatches.Load(), "busy-polling from the first batch on")
			require.EqualValues(t, writes-cp.blocking.Load(), cp.polled.Load())
			require.Positive(t, cp.polled.Load())
		}
		done := make(chan error, 1)
		go func() { done <- b.e.Close() }()
		select {
		case err := <-done:
			require.NoError(t, err)
			// After Close (its goroutines are done: the race detector
			// sees no socket between the responder and this one).
			require.Equal(t, abuf[:writes], bbuf[:writes])
		case <-time.After(20 * time.Second):
			t.Fatalf("busy %v: Close did not stop the busy-polling receive goroutine", busy)
		}
	}
}
