package roce

import (
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/polltest"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// gatedPoll is a pollable Conn whose PollLent, once armed, stops after it
// has taken datagrams and before it returns them: the moment a poller's
// recvmmsg has returned and its goroutine is descheduled.
type gatedPoll struct {
	transport.Conn
	p       transport.Poller
	armed   atomic.Bool
	inPoll  chan struct{}
	release chan struct{}
	closed  atomic.Bool
	sends   atomic.Int64 // Sends after Close
}

func (g *gatedPoll) ReceiveLent(p [][]byte, e []transport.Endpoint, l []*transport.Lease) (int, error) {
	return g.p.ReceiveLent(p, e, l)
}
func (g *gatedPoll) ReceiveLentLocked(p [][]byte, e []transport.Endpoint, l []*transport.Lease, mu sync.Locker) (int, error) {
	return g.p.ReceiveLentLocked(p, e, l, mu)
}
func (g *gatedPoll) PollLent(p [][]byte, e []transport.Endpoint, l []*transport.Lease) (int, error) {
	n, err := g.p.PollLent(p, e, l)
	if n > 0 && g.armed.CompareAndSwap(true, false) {
		close(g.inPoll)
		<-g.release
	}
	return n, err
}
func (g *gatedPoll) Cover()        { g.p.Cover() }
func (g *gatedPoll) Uncover()      { g.p.Uncover() }
func (g *gatedPoll) CanPoll() bool { return true }
func (g *gatedPoll) Close() error  { g.closed.Store(true); return g.Conn.Close() }
func (g *gatedPoll) Send(b [][]byte, ep transport.Endpoint) error {
	if g.closed.Load() {
		g.sends.Add(1)
	}
	return g.Conn.Send(b, ep)
}

// TestCloseWaitsForAPollerDispatching: a batch a poller took before Close
// began is handled before Close returns (its receive completes, its ACK
// leaves before the socket closes), and pollers take nothing after.
// Bug (found by an audit of the engine, session AE): Close never waited
// for rxMu, so a poller between its receive call and the end of its
// dispatch (the application's Progress, another engine's spinner, a
// receive loop helping) handled the packet after Close returned, and the
// ACK it kept for the application's answer was never sent: the peer
// retried into the void.
func TestCloseWaitsForAPollerDispatching(t *testing.T) {
	a := newUDPSide(t, "127.0.0.1", false)
	addr := netip.MustParseAddr("127.0.0.1")
	uc, err := transport.OpenUDP(transport.UDPConfig{Addrs: []netip.Addr{addr}})
	require.NoError(t, err)
	only, err := polltest.Only(uc)
	require.NoError(t, err)
	g := &gatedPoll{Conn: only, p: only.(transport.Poller), inPoll: make(chan struct{}), release: make(chan struct{})}
	b := sideOn(t, g, addr, qp.RC, sideCap)
	connectUDP(t, a, b)
	bm, _ := regMR(t, b, 4096)
	am, _ := regMR(t, a, 4096)
	_, err = b.e.PostRecv(b.q, []qp.RecvWR{{ID: 7, SGL: []qp.SGE{{Addr: bm.IOVA(), Length: 64, LKey: bm.LKey()}}}})
	require.NoError(t, err)
	g.armed.Store(true)
	_, err = a.e.PostSend(a.q, []qp.SendWR{{ID: 1, Opcode: qp.WRSend, Flags: qp.Signaled,
		SGL: []qp.SGE{{Addr: am.IOVA(), Length: 8, LKey: am.LKey()}}}})
	require.NoError(t, err)

	polled := make(chan int)
	go func() {
		n := 0
		for n == 0 {
			n = b.e.Progress()
		}
		polled <- n
	}()
	<-g.inPoll // the poller took the SEND and holds it
	closed := make(chan struct{})
	go func() { _ = b.e.Close(); close(closed) }()
	for !b.e.closing.Load() { // Close began
		runtime.Gosched()
	}
	// Close must now wait for the poller. A wait is only seen by its
	// absence: Close returning while the poller still holds its batch
	// fails at once; still waiting after the bound, it passes (a slow
	// machine can only make a broken Close look right, never a correct
	// one look wrong).
	select {
	case <-closed:
		t.Fatal("Close returned while a poller still held a batch it took")
	case <-time.After(time.Second):
	}
	close(g.release) // the poller goes on
	<-closed
	require.Equal(t, 1, b.rcq.Len(), "the receive a poller took before Close began completes before Close returns")
	require.Equal(t, 1, <-polled)
	require.Zero(t, g.sends.Load(), "a send on the closed Conn")
	require.Zero(t, b.e.Progress(), "a poll after Close")
}
