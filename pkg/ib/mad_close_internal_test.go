package ib

import (
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// TestMADAgentCloseSendsWhatWasPosted closes the agent right after a
// Send whose post only recorded a kick for the shard's busy owner (the
// engine's worker goroutine): Close must see the MAD leave before it
// destroys QP1. Bug (rdmacm's flaky TestPeerDeviceCloseEndsTheConnection,
// session P): Close destroyed QP1 at once, DestroyQP's forget reached
// the worker before the recorded kick was settled, and the MAD (a
// closing device's DREQ) went with the QP.
//
// The worker is made the owner of the device's only shard, held inside
// a QP's run with kicks being recorded, by a gate on the transport: a
// UD QP's post blocks in Send, as the posting goroutine's inline owner,
// after it stopped taking kicks (release: settle, then flush); two more
// posts then queue an evKick the worker runs once the gate lets that
// Send go, and their two packets fill the batch (BatchSize 2), whose
// flush inside the run blocks the worker in turn. The MAD's post then
// finds the shard owned and records its kick.
func TestMADAgentCloseSendsWhatWasPosted(t *testing.T) {
	mem := transport.NewMemNetwork()
	local := netip.MustParseAddr("10.77.0.1")
	peer := netip.MustParseAddr("10.77.0.2") // nobody listens: the network drops what it is sent
	conn, err := mem.Listen(netip.AddrPortFrom(local, transport.RoCEv2Port))
	require.NoError(t, err)
	gate := newSendGate()
	dev, err := OpenDevice(Config{Conn: conn, Workers: 1, // one shard: QP1 and x share it
		Wrap: func(c transport.Conn) (transport.Conn, error) { gate.Conn = c; return gate, nil }})
	require.NoError(t, err)
	t.Cleanup(func() { gate.open(); dev.Close() })

	agent, err := OpenMADAgent(dev, MADAgentConfig{Handler: func(_, _ netip.Addr, _ []byte) {}})
	require.NoError(t, err)
	// The bound must not decide this test on a loaded machine.
	agent.settleFor = time.Hour
	var settleWaits atomic.Int32
	agent.testSettleWait = func() { settleWaits.Add(1) }

	pd, err := dev.AllocPD()
	require.NoError(t, err)
	cq, err := dev.CreateCQ(16)
	require.NoError(t, err)
	x, err := pd.CreateQP(QPInitAttr{Type: UD, SendCQ: cq, RecvCQ: cq,
		Cap: QPCap{MaxSendWR: 8, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}})
	require.NoError(t, err)
	require.NoError(t, x.Modify(&QPAttr{State: QPSInit, PortNum: 1, QKey: 0x1111}, AttrState|AttrPKeyIndex|AttrPort|AttrQKey))
	require.NoError(t, x.Modify(&QPAttr{State: QPSRTR}, AttrState))
	require.NoError(t, x.Modify(&QPAttr{State: QPSRTS, SQPSN: 1}, AttrState|AttrSQPSN))
	const xDest = 0x99 // the QPN x's datagrams name
	xSend := func(id uint64) SendWR {
		return SendWR{ID: id, Opcode: WRSend, Flags: SendSignaled | SendInline, Inline: []byte("hold the shard"),
			AV: AddrVector{DGID: peer, PortNum: 1, DestPort: dev.UDPPort()}, RemoteQPN: xDest, RemoteQKey: 0x1111}
	}

	gate.shut()
	posted := make(chan error, 1)
	go func() { posted <- x.PostSend(xSend(1)) }()
	gate.await(t, "x's first post blocked in Send as the shard's inline owner",
		func() bool { return gate.arrivals == 1 && gate.blocked == 1 })
	// The shard is held and no longer records kicks: this post's kick
	// queues an evKick for the worker goroutine.
	require.NoError(t, x.PostSend(xSend(2), xSend(3)))
	gate.pass(1)
	require.NoError(t, <-posted)
	gate.await(t, "the worker blocked in Send, flushing x's full batch inside x's run",
		func() bool { return gate.arrivals == 2 && gate.blocked == 1 })
	require.Equal(t, []uint32{xDest, xDest}, gate.lastBlocked(), "the Send blocked second is not x's batch of two")

	mad := make([]byte, MADLen)
	mad[0] = 0x01 // base version 1: something of a MAD's shape
	require.NoError(t, agent.Send(local, peer, mad))
	var closeErr error
	closed := make(chan struct{})
	go func() { closeErr = agent.Close(); close(closed) }()
	t.Cleanup(func() { gate.open(); <-closed })

	gsi := agent.qp.q
	gate.await(t, "Close waiting for the MAD, or destroying QP1", func() bool {
		return settleWaits.Load() > 0 || gsi.Closed()
	})
	if settleWaits.Load() == 0 {
		// Informative only: whether the forget beat the recorded kick
		// depends on how far DestroyQP got before the gate opens.
		gate.open()
		<-closed
		t.Fatalf("QP1 was destroyed with a MAD in flight (MADs sent since: %d)", gate.sentTo(GSIQPN))
	}
	require.Zero(t, gate.sentTo(GSIQPN), "the MAD left through a gate that was shut")
	gate.open()
	<-closed
	require.NoError(t, closeErr)
	require.Equal(t, 1, gate.sentTo(GSIQPN), "the MAD posted before Close did not leave")
	st := agent.Stats()
	require.EqualValues(t, 1, st.Sent)
	require.Zero(t, st.SendErrors)
	require.True(t, gsi.Closed())
}

// sendGate is a Conn whose Send, while the gate is shut, blocks (and
// says so) until the gate opens or lets it pass; it logs the BTH
// destination QP of every datagram it passes on. It offers no optional
// transport interface (no Poller, no GatherSender): the engine sends
// through Send, from the shard's owner only.
type sendGate struct {
	transport.Conn
	mu       sync.Mutex
	cond     *sync.Cond
	closed   bool     // shut
	passes   int      // Sends to let through while shut
	arrivals int      // Sends called
	blocked  int      // Sends waiting now
	blockedQ []uint32 // destination QPs of the last Send that blocked
	sent     []uint32 // destination QPs of the datagrams passed on
}

func newSendGate() *sendGate {
	g := &sendGate{}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// BatchSize is 2, so that a run of two sends flushes inside the run.
func (g *sendGate) BatchSize() int { return 2 }

func (g *sendGate) Send(bufs [][]byte, ep transport.Endpoint) error {
	qps := make([]uint32, len(bufs))
	for i, b := range bufs {
		qps[i] = wire.BTH(b[:wire.BTHLen]).DestQP()
	}
	g.mu.Lock()
	g.arrivals++
	if g.closed && g.passes == 0 {
		g.blocked++
		g.blockedQ = qps
		for g.closed && g.passes == 0 {
			g.cond.Wait()
		}
		g.blocked--
	}
	if g.closed {
		g.passes--
	}
	g.sent = append(g.sent, qps...)
	g.mu.Unlock()
	return g.Conn.Send(bufs, ep)
}

func (g *sendGate) shut() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

func (g *sendGate) open() {
	g.mu.Lock()
	g.closed = false
	g.cond.Broadcast()
	g.mu.Unlock()
}

// pass lets n Sends through the shut gate.
func (g *sendGate) pass(n int) {
	g.mu.Lock()
	g.passes += n
	g.cond.Broadcast()
	g.mu.Unlock()
}

func (g *sendGate) lastBlocked() []uint32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.blockedQ
}

// sentTo counts the datagrams passed on to QP qpn.
func (g *sendGate) sentTo(qpn uint32) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, q := range g.sent {
		if q == qpn {
			n++
		}
	}
	return n
}

// await spins until cond holds (evaluated under the gate's lock); the
// wall-clock limit only turns a hang into a failure naming what.
func (g *sendGate) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		g.mu.Lock()
		ok := cond()
		g.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}
