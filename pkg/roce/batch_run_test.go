package roce

import (
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// gateConn is a requester's Conn for TestQPRunsAfterItsWholeBatch: it
// drops the one request with PSN drop, records the PSN of every request
// sent, and holds what arrives until open, then returns all of it in one
// Receive (one batch).
type gateConn struct {
	transport.Conn
	drop uint32

	mu     sync.Mutex
	cond   *sync.Cond
	sent   []uint32
	held   [][]byte
	heldEP []transport.Endpoint
	open   bool
	err    error
}

func newGateConn(inner transport.Conn, drop uint32) *gateConn {
	g := &gateConn{Conn: inner, drop: drop}
	g.cond = sync.NewCond(&g.mu)
	go g.pump()
	return g
}

func (g *gateConn) pump() {
	bufs, sizes, eps := [][]byte{make([]byte, transport.MaxDatagramSize)}, []int{0}, make([]transport.Endpoint, 1)
	for {
		n, err := g.Conn.Receive(bufs, sizes, eps)
		g.mu.Lock()
		for i := range n {
			g.held = append(g.held, append([]byte(nil), bufs[i][:sizes[i]]...))
			g.heldEP = append(g.heldEP, eps[i])
		}
		if err != nil {
			g.err = err
		}
		g.cond.Broadcast()
		g.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (g *gateConn) Receive(bufs [][]byte, sizes []int, eps []transport.Endpoint) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for !(g.open && len(g.held) > 0) && g.err == nil {
		g.cond.Wait()
	}
	if len(g.held) == 0 {
		return 0, g.err
	}
	n := min(len(g.held), len(bufs))
	for i := range n {
		sizes[i] = copy(bufs[i], g.held[i])
		eps[i] = g.heldEP[i]
	}
	g.held, g.heldEP = g.held[n:], g.heldEP[n:]
	return n, nil
}

func (g *gateConn) Send(bufs [][]byte, ep transport.Endpoint) error {
	keep := bufs[:0:0]
	g.mu.Lock()
	for _, b := range bufs {
		psn := wire.BTH(b).PSN()
		g.sent = append(g.sent, psn)
		if psn != g.drop {
			keep = append(keep, b)
		}
	}
	g.cond.Broadcast()
	g.mu.Unlock()
	return g.Conn.Send(keep, ep)
}

// waitLocked waits, with g.mu held, until cond holds (10 s at most).
func (g *gateConn) waitLocked(t *testing.T, cond func() bool) {
	t.Helper()
	expired := false
	timer := time.AfterFunc(10*time.Second, func() {
		g.mu.Lock()
		expired = true
		g.cond.Broadcast()
		g.mu.Unlock()
	})
	defer timer.Stop()
	for !cond() {
		if expired {
			g.mu.Unlock()
			t.Fatalf("gave up waiting: sent %d requests, holding %d datagrams", len(g.sent), len(g.held))
		}
		g.cond.Wait()
	}
}

// heldNAK reports whether a NAK is among the datagrams held.
func (g *gateConn) heldNAK() bool {
	for _, b := range g.held {
		var p wire.Packet
		if p.Parse(b) == nil && p.AETH != nil && p.AETH.Syndrome().Kind() == wire.SynNAK {
			return true
		}
	}
	return false
}

// A QP runs once the whole received batch is in, not after each packet of
// it. Running it after each one sent, for every ACK of a batch [ACK, ACK,
// NAK], the new PSNs the ACK let into the window, and the NAK then threw
// them away: a go-back-N responder drops everything after the gap. Under
// a 64 KiB WRITE stream whose sender is short of CPU, ACKs queue up, and
// `rxed perf write --fault loss=0.01` sent 6% fewer packets and moved 11%
// more (issue 14, goal 7). The requester's clock is a fake one, so no
// timer fires; the responder is a real engine.
func TestQPRunsAfterItsWholeBatch(t *testing.T) {
	const (
		msgPSNs = 16 // a 16 KiB WRITE at MTU 1024
		msgs    = 12 // 8 fill the initial window of 128 PSNs
		first   = 100
		lost    = first + 2*msgPSNs // the third WRITE's first packet
	)
	net := transport.NewMemNetwork()
	b := newSide(t, net, "10.0.0.2", qp.RC)
	aAddr := netip.MustParseAddr("10.0.0.1")
	c, err := net.Listen(netip.AddrPortFrom(aAddr, transport.RoCEv2Port))
	require.NoError(t, err)
	gate := newGateConn(c, lost)
	e, err := New(Config{Conn: gate, Workers: 1, Clock: NewFakeClock(time.Unix(0, 0)), IBATimerOnly: true})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	pd, err := e.Memory().AllocPD()
	require.NoError(t, err)
	scq, _ := qp.NewCQ(256)
	rcq, _ := qp.NewCQ(256)
	q, err := e.CreateQP(qp.Config{Type: qp.RC, PD: pd, SendCQ: scq, RecvCQ: rcq, Cap: sideCap})
	require.NoError(t, err)
	a := &side{e: e, pd: pd, scq: scq, rcq: rcq, q: q, addr: aAddr}
	connect(t, a, b, qp.MTU1024, 14)
	m, _ := regMR(t, a, msgPSNs*1024)
	dst, _ := regMR(t, b, msgPSNs*1024)
	wrs := make([]qp.SendWR, msgs)
	for i := range wrs {
		wrs[i] = qp.SendWR{ID: uint64(i), Opcode: qp.WRRDMAWrite, Flags: qp.Signaled,
			SGL: []qp.SGE{{Addr: m.IOVA(), Length: msgPSNs * 1024, LKey: m.LKey()}}, RemoteAddr: dst.IOVA(), RKey: dst.RKey()}
	}
	_, err = e.PostSend(q, wrs)
	require.NoError(t, err)

	// The whole window is sent (the third WRITE's first packet lost on
	// the way): the requester stops once it is more than MaxUnackedPSNs
	// ahead (rxe's check), so after MaxUnackedPSNs + 1 packets, which may
	// take several sends; waiting for fewer would let the last of them
	// race the batch. And the responder has answered: two ACKs (or one
	// coalesced) and the NAK of the gap, all held.
	const window = qp.MaxUnackedPSNs + 1
	gate.mu.Lock()
	gate.waitLocked(t, func() bool { return len(gate.sent) >= window && gate.heldNAK() })
	sent, held := len(gate.sent), len(gate.held)
	gate.open = true
	gate.cond.Broadcast()
	gate.waitLocked(t, func() bool { return len(gate.sent) > sent })
	after := slices.Clone(gate.sent[sent:])
	gate.mu.Unlock()

	require.Equal(t, window, sent, "the initial window, no more")
	require.LessOrEqual(t, held, 3, "two ACKs (or one coalesced) and the NAK")
	const used = first + window // one past the last PSN sent
	// Whatever the batch provoked left in one flush: the first request
	// after it is the resend at the NAK's PSN, and nothing past the PSNs
	// already used went out before it.
	require.Equal(t, uint32(lost), after[0], "the resend comes first: %v", after)
	for _, psn := range after {
		require.Less(t, psn, uint32(used), "no new PSN sent on an ACK the batch's NAK overtakes: %v", after)
	}
}
