package ib_test

import (
	"bytes"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// gotMAD is one handler call.
type gotMAD struct {
	src, dst netip.Addr
	mad      []byte
}

// madSink collects what a MAD handler receives.
type madSink struct {
	mu  sync.Mutex
	got []gotMAD
	ch  chan gotMAD
}

func newSink() *madSink { return &madSink{ch: make(chan gotMAD, 1024)} }

func (s *madSink) handle(src, dst netip.Addr, mad []byte) {
	s.mu.Lock()
	s.got = append(s.got, gotMAD{src, dst, mad})
	s.mu.Unlock()
	s.ch <- gotMAD{src, dst, mad}
}

func (s *madSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

// next waits for the next MAD the handler got.
func (s *madSink) next(t *testing.T) gotMAD {
	t.Helper()
	select {
	case g := <-s.ch:
		return g
	case <-time.After(10 * time.Second):
		t.Fatal("no MAD delivered")
		return gotMAD{}
	}
}

// testMAD is a recognisable 256-byte MAD: a CM-class header (base
// version 1, class 0x07, version 2, method SEND) and a tag.
func testMAD(tag uint32) []byte {
	m := make([]byte, ib.MADLen)
	m[0], m[1], m[2], m[3] = 1, 0x07, 2, 0x03
	m[8], m[9], m[10], m[11] = byte(tag>>24), byte(tag>>16), byte(tag>>8), byte(tag)
	for i := 24; i < len(m); i++ {
		m[i] = byte(i) ^ byte(tag)
	}
	return m
}

// tapConn records the datagrams the engine sends.
type tapConn struct {
	transport.Conn
	mu   sync.Mutex
	sent [][]byte
}

func (c *tapConn) Send(bufs [][]byte, ep transport.Endpoint) error {
	c.mu.Lock()
	for _, b := range bufs {
		c.sent = append(c.sent, append([]byte(nil), b...))
	}
	c.mu.Unlock()
	return c.Conn.Send(bufs, ep)
}

func (c *tapConn) packets() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]byte(nil), c.sent...)
}

// madDevice opens a device at addr on net, optionally tapping what it
// sends.
func madDevice(t *testing.T, net *transport.MemNetwork, addr string, tap *tapConn) *ib.Device {
	t.Helper()
	conn, err := net.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), transport.RoCEv2Port))
	require.NoError(t, err)
	cfg := ib.Config{Conn: conn, Workers: 1}
	if tap != nil {
		cfg.Wrap = func(c transport.Conn) (transport.Conn, error) { tap.Conn = c; return tap, nil }
	}
	dev, err := ib.OpenDevice(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	return dev
}

func openAgent(t *testing.T, dev *ib.Device, cfg ib.MADAgentConfig) *ib.MADAgent {
	t.Helper()
	a, err := ib.OpenMADAgent(dev, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { a.Close() })
	return a
}

// TestMADAgentExchange: two devices exchange MADs both ways, over IPv4
// and IPv6; each side sees the peer's and its own address from the GRH,
// the bytes arrive intact, and the packets on the wire are what rxe
// sends for QP1: UD SEND_ONLY to QP 1, P_Key 0xFFFF, DETH Q_Key
// 0x80010000 and source QP 1, a 256-byte payload.
func TestMADAgentExchange(t *testing.T) {
	for _, c := range []struct{ name, a, b string }{
		{"IPv4", "10.0.0.1", "10.0.0.2"},
		{"IPv6", "fd00::1", "fd00::2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			net := transport.NewMemNetwork()
			tap := &tapConn{}
			devA := madDevice(t, net, c.a, tap)
			devB := madDevice(t, net, c.b, nil)
			addrA, addrB := netip.MustParseAddr(c.a), netip.MustParseAddr(c.b)
			sinkA := newSink()
			agentA := openAgent(t, devA, ib.MADAgentConfig{Handler: sinkA.handle})
			var agentB *ib.MADAgent
			sinkB := newSink()
			// B answers every MAD from its handler, to where it came from.
			agentB = openAgent(t, devB, ib.MADAgentConfig{Handler: func(src, dst netip.Addr, mad []byte) {
				sinkB.handle(src, dst, mad)
				reply := bytes.Clone(mad)
				reply[3] = 0x83 // a response
				if err := agentB.Send(dst, src, reply); err != nil {
					t.Errorf("reply: %v", err)
				}
			}})

			for i := range 3 {
				// IPv4 in its mapped GID form is the same address.
				src := addrA
				if i == 1 && src.Is4() {
					src = netip.AddrFrom16(src.As16())
				}
				require.NoError(t, agentA.Send(src, addrB, testMAD(uint32(i))))
				g := sinkB.next(t)
				require.Equal(t, addrA, g.src)
				require.Equal(t, addrB, g.dst)
				require.Equal(t, testMAD(uint32(i)), g.mad)
				r := sinkA.next(t)
				require.Equal(t, addrB, r.src)
				require.Equal(t, addrA, r.dst)
				want := testMAD(uint32(i))
				want[3] = 0x83
				require.Equal(t, want, r.mad)
			}
			require.Equal(t, uint64(3), agentA.Stats().Sent)
			require.Equal(t, uint64(3), agentA.Stats().Received)
			require.Equal(t, uint64(3), agentB.Stats().Received)

			require.Equal(t, uint32(1), agentB.QP().Num())
			require.Equal(t, ib.GSI, agentB.QP().Type())
			attr, _, err := agentB.QP().Query()
			require.NoError(t, err)
			require.Equal(t, uint32(ib.GSIQKey), attr.QKey)
			require.Equal(t, ib.QPSRTS, attr.State)

			pkts := tap.packets()
			require.Len(t, pkts, 3, "A sent its three MADs and nothing else")
			for _, raw := range pkts {
				var p wire.Packet
				require.NoError(t, p.Parse(raw))
				require.Equal(t, wire.UDSendOnly, p.Opcode)
				require.Equal(t, uint32(1), p.BTH.DestQP())
				require.Equal(t, uint16(0xFFFF), p.BTH.PKey())
				require.Equal(t, uint32(0x80010000), p.DETH.QKey())
				require.Equal(t, uint32(1), p.DETH.SrcQP())
				require.Len(t, p.Payload, 256)
			}
			for _, dev := range []*ib.Device{devA, devB} {
				for k, v := range dev.Counters() {
					if len(k) > 5 && k[:5] == "drop_" {
						require.Zero(t, v, k)
					}
				}
			}
		})
	}
}

// injector sends hand-built packets to a device from its own address on
// the network.
type injector struct {
	conn transport.Conn
	flow wire.Flow
}

func newInjector(t *testing.T, net *transport.MemNetwork, from, to string) *injector {
	t.Helper()
	src := netip.AddrPortFrom(netip.MustParseAddr(from), transport.RoCEv2Port)
	conn, err := net.Listen(src)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return &injector{conn: conn, flow: wire.Flow{Src: src, Dst: netip.AddrPortFrom(netip.MustParseAddr(to), transport.RoCEv2Port)}}
}

// send builds h with payload, seals its ICRC for the flow and sends it.
func (in *injector) send(t *testing.T, h wire.Headers, payload []byte) {
	t.Helper()
	buf := make([]byte, h.Len(len(payload)))
	n, err := h.Encode(buf, payload)
	require.NoError(t, err)
	in.flow.Seal(buf[:n])
	require.NoError(t, in.conn.Send([][]byte{buf[:n]}, transport.Endpoint{Local: in.flow.Src, Remote: in.flow.Dst}))
}

// gsiHeaders is a well-formed CM MAD packet to QP1.
func gsiHeaders(psn uint32) wire.Headers {
	return wire.Headers{Opcode: wire.UDSendOnly, PKey: 0xFFFF, DestQP: 1, PSN: psn, QKey: ib.GSIQKey, SrcQP: 1}
}

// TestGSIReceiveChecks injects packets at QP1 and QP0 as rxe's
// check_type_state and check_keys judge them: the wrong Q_Key is
// drop_qkey, a P_Key that does not match the default is drop_pkey (0x7FFF,
// the limited-member default, matches), QP0 never exists (drop_qp), an RC
// packet to QP1 is drop_qp_type. Only the good ones reach the handler,
// with the injector's address.
func TestGSIReceiveChecks(t *testing.T) {
	net := transport.NewMemNetwork()
	dev := madDevice(t, net, "10.0.0.2", nil)
	sink := newSink()
	agent := openAgent(t, dev, ib.MADAgentConfig{Handler: sink.handle})
	in := newInjector(t, net, "10.0.0.9", "10.0.0.2")
	base := dev.Counters()

	bad := []struct {
		name    string
		edit    func(h *wire.Headers)
		counter string
	}{
		{"qkey zero", func(h *wire.Headers) { h.QKey = 0 }, "drop_qkey"},
		{"qkey off by one", func(h *wire.Headers) { h.QKey = ib.GSIQKey + 1 }, "drop_qkey"},
		{"qkey of a UD QP", func(h *wire.Headers) { h.QKey = 0x11111111 }, "drop_qkey"},
		{"pkey 0x1234", func(h *wire.Headers) { h.PKey = 0x1234 }, "drop_pkey"},
		{"pkey 0x8000", func(h *wire.Headers) { h.PKey = 0x8000 }, "drop_pkey"},
		{"QP0", func(h *wire.Headers) { h.DestQP = 0 }, "drop_qp"},
		{"RC to QP1", func(h *wire.Headers) { h.Opcode = wire.RCSendOnly }, "drop_qp_type"},
	}
	want := map[string]uint64{}
	for i, b := range bad {
		h := gsiHeaders(uint32(i))
		b.edit(&h)
		in.send(t, h, testMAD(uint32(100+i)))
		want[b.counter]++
	}
	// Good ones, the last sent after every bad one: the device handles
	// them in order (one worker), so once it is delivered every drop is
	// counted.
	in.send(t, gsiHeaders(50), testMAD(1))
	limited := gsiHeaders(51)
	limited.PKey = 0x7FFF
	in.send(t, limited, testMAD(2))
	for _, tag := range []uint32{1, 2} {
		g := sink.next(t)
		require.Equal(t, testMAD(tag), g.mad)
		require.Equal(t, netip.MustParseAddr("10.0.0.9"), g.src)
		require.Equal(t, netip.MustParseAddr("10.0.0.2"), g.dst)
	}
	now := dev.Counters()
	for k, v := range now {
		if len(k) > 5 && k[:5] == "drop_" {
			require.Equal(t, base[k]+want[k], v, k)
		}
	}
	require.Equal(t, 2, sink.count(), "only the good packets reach the handler")
	require.Equal(t, uint64(2), agent.Stats().Received)
	require.Equal(t, ib.QPSRTS, agent.QP().State(), "drops change nothing")
}

// TestMADAgentRecvErrors: a packet too long for a MAD buffer completes
// its receive with LOC_LEN_ERR; the agent counts it, reposts the buffer
// and keeps delivering. A shorter one is delivered as it came (the CM's
// parser judges it).
func TestMADAgentRecvErrors(t *testing.T) {
	net := transport.NewMemNetwork()
	dev := madDevice(t, net, "fd00::2", nil)
	sink := newSink()
	agent := openAgent(t, dev, ib.MADAgentConfig{Handler: sink.handle, RecvDepth: 2})
	in := newInjector(t, net, "fd00::9", "fd00::2")
	for i := range 3 { // more than the receive queue: each buffer is reposted
		in.send(t, gsiHeaders(uint32(i)), make([]byte, 512))
		require.Eventually(t, func() bool { return agent.Stats().RecvErrors == uint64(i+1) }, 10*time.Second, time.Millisecond)
	}
	in.send(t, gsiHeaders(9), []byte("short"))
	g := sink.next(t)
	require.Equal(t, []byte("short"), g.mad)
	require.Equal(t, netip.MustParseAddr("fd00::9"), g.src)
	require.Equal(t, uint64(3), agent.Stats().RecvErrors)
	require.Equal(t, uint64(1), agent.Stats().Received)
	require.Equal(t, ib.QPSRTS, agent.QP().State())
}

// TestMADAgentBurstRefill: with 4 receive buffers, 60 MADs sent in waves
// of 4 all arrive (each buffer is reposted); a burst that meets a
// blocked handler fills exactly the 4 posted buffers (the one being
// handled was reposted first) and the rest is lost, as UD without
// receives loses; afterwards the queue is full again.
func TestMADAgentBurstRefill(t *testing.T) {
	net := transport.NewMemNetwork()
	devA := madDevice(t, net, "10.0.0.1", nil)
	devB := madDevice(t, net, "10.0.0.2", nil)
	a := openAgent(t, devA, ib.MADAgentConfig{Handler: func(netip.Addr, netip.Addr, []byte) {}})
	sink := newSink()
	var gate chan struct{} // non-nil: the handler waits for it once
	var entered chan struct{}
	var gateMu sync.Mutex
	const depth = 4
	b := openAgent(t, devB, ib.MADAgentConfig{RecvDepth: depth, Handler: func(src, dst netip.Addr, mad []byte) {
		gateMu.Lock()
		g, e := gate, entered
		gate = nil
		gateMu.Unlock()
		if g != nil {
			close(e)
			<-g
		}
		sink.handle(src, dst, mad)
	}})
	src, dst := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	tag := uint32(0)
	wave := func() {
		for range depth {
			require.NoError(t, a.Send(src, dst, testMAD(tag)))
			tag++
		}
		for i := range depth {
			require.Equal(t, testMAD(tag-depth+uint32(i)), sink.next(t).mad)
		}
	}
	for range 15 {
		wave()
	}
	require.Equal(t, 60, sink.count())

	g, e := make(chan struct{}), make(chan struct{})
	gateMu.Lock()
	gate, entered = g, e
	gateMu.Unlock()
	rcvd := devB.Counters()["rcvd_pkts"]
	require.NoError(t, a.Send(src, dst, testMAD(1000)))
	<-e // the handler holds the first MAD; its buffer is posted again
	for i := range 19 {
		require.NoError(t, a.Send(src, dst, testMAD(1001+uint32(i))))
	}
	require.Eventually(t, func() bool { return devB.Counters()["rcvd_pkts"] == rcvd+20 }, 10*time.Second, time.Millisecond)
	close(g)
	for i := range depth + 1 {
		require.Equal(t, testMAD(1000+uint32(i)), sink.next(t).mad, "the first %d of the burst", depth+1)
	}
	wave() // refilled: a whole wave arrives again
	require.Equal(t, 60+depth+1+depth, sink.count())
	require.Equal(t, uint64(60+depth+1+depth), b.Stats().Received)
}

// TestMADAgentCloseUnderTraffic closes both agents while MADs flow both
// ways: Close returns, no handler runs after it, later sends fail with
// ErrMADAgentClosed, and QP1 is free for a new agent that works.
func TestMADAgentCloseUnderTraffic(t *testing.T) {
	net := transport.NewMemNetwork()
	devA := madDevice(t, net, "10.0.0.1", nil)
	devB := madDevice(t, net, "10.0.0.2", nil)
	addrA, addrB := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	var closedA, closedB, late atomic.Bool
	var recvA, recvB atomic.Int64
	var agentA, agentB *ib.MADAgent
	agentA = openAgent(t, devA, ib.MADAgentConfig{RecvDepth: 8, SendDepth: 4, Handler: func(src, dst netip.Addr, mad []byte) {
		if closedA.Load() {
			late.Store(true)
		}
		recvA.Add(1)
	}})
	agentB = openAgent(t, devB, ib.MADAgentConfig{RecvDepth: 8, SendDepth: 4, Handler: func(src, dst netip.Addr, mad []byte) {
		if closedB.Load() {
			late.Store(true)
		}
		recvB.Add(1)
		err := agentB.Send(dst, src, mad) // echo, from the handler
		if err != nil && !errors.Is(err, ib.ErrMADAgentClosed) {
			t.Errorf("echo: %v", err)
		}
	}})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				err := agentA.Send(addrA, addrB, testMAD(uint32(w<<16|i)))
				if errors.Is(err, ib.ErrMADAgentClosed) {
					return
				}
				if err != nil {
					t.Errorf("send: %v", err)
					return
				}
			}
		}()
	}
	require.Eventually(t, func() bool { return recvA.Load() > 50 && recvB.Load() > 50 }, 10*time.Second, time.Millisecond)
	require.NoError(t, agentB.Close())
	closedB.Store(true)
	require.NoError(t, agentB.Close(), "closing twice is harmless")
	require.ErrorIs(t, agentB.Send(addrB, addrA, testMAD(0)), ib.ErrMADAgentClosed)
	require.NoError(t, agentA.Close())
	closedA.Store(true)
	close(stop)
	wg.Wait()
	require.False(t, late.Load(), "a handler ran after Close returned")

	// Wait until B has judged every packet A sent (MemNetwork queued
	// them at once): none of the old traffic is left for the new agent.
	require.Eventually(t, func() bool {
		a, b := devA.Counters(), devB.Counters()
		return b["rcvd_pkts"]+b["drop_qp"]+b["drop_overrun"] == a["sent_pkts"]
	}, 10*time.Second, time.Millisecond)

	// QP1 is free again on both devices.
	sink := newSink()
	again := openAgent(t, devB, ib.MADAgentConfig{Handler: sink.handle})
	sender := openAgent(t, devA, ib.MADAgentConfig{Handler: func(netip.Addr, netip.Addr, []byte) {}})
	require.NoError(t, sender.Send(addrA, addrB, testMAD(7)))
	require.Equal(t, testMAD(7), sink.next(t).mad)
	require.Equal(t, uint32(1), again.QP().Num())
}

// TestMADAgentRecovers: QP1 moved to ERR (as a send that cannot leave
// would) is brought back to RTS with its receives posted.
func TestMADAgentRecovers(t *testing.T) {
	net := transport.NewMemNetwork()
	devA := madDevice(t, net, "10.0.0.1", nil)
	devB := madDevice(t, net, "10.0.0.2", nil)
	a := openAgent(t, devA, ib.MADAgentConfig{Handler: func(netip.Addr, netip.Addr, []byte) {}})
	sink := newSink()
	b := openAgent(t, devB, ib.MADAgentConfig{Handler: sink.handle, RecvDepth: 4})
	require.NoError(t, b.QP().Modify(&ib.QPAttr{State: ib.QPSErr}, ib.AttrState))
	require.Eventually(t, func() bool { return b.Stats().Recoveries == 1 && b.QP().State() == ib.QPSRTS },
		10*time.Second, time.Millisecond)
	src, dst := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	for i := range 8 { // more than RecvDepth: every buffer was reposted
		require.NoError(t, a.Send(src, dst, testMAD(uint32(i))))
		require.Equal(t, testMAD(uint32(i)), sink.next(t).mad)
	}
	require.Equal(t, uint64(1), b.Stats().Recoveries)
}

// TestMADAgentSendRefusals: Send checks the MAD's length and the address
// pair before anything reaches QP1, which stays in RTS.
func TestMADAgentSendRefusals(t *testing.T) {
	net := transport.NewMemNetwork()
	dev := madDevice(t, net, "10.0.0.1", nil)
	a := openAgent(t, dev, ib.MADAgentConfig{Handler: func(netip.Addr, netip.Addr, []byte) {}})
	v4, v6 := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::2")
	self := netip.MustParseAddr("10.0.0.1")
	require.Error(t, a.Send(self, v4, make([]byte, 255)))
	require.Error(t, a.Send(self, v4, make([]byte, 257)))
	require.ErrorIs(t, a.Send(netip.MustParseAddr("10.0.0.3"), v4, testMAD(1)), ib.ErrBadAV, "source not a local GID")
	require.ErrorIs(t, a.Send(self, v6, testMAD(1)), ib.ErrBadAV, "other family")
	require.ErrorIs(t, a.Send(self, netip.Addr{}, testMAD(1)), ib.ErrBadAV)
	require.Equal(t, ib.QPSRTS, a.QP().State())
	require.Zero(t, a.Stats().Sent)
	_, err := ib.OpenMADAgent(dev, ib.MADAgentConfig{})
	require.Error(t, err, "a handler is required")
}

// TestGSIQPCreate: CreateQP of type GSI gives QP1, once per device; its
// Q_Key and P_Key index stay fixed whatever Modify is given; it takes UD
// work requests.
func TestGSIQPCreate(t *testing.T) {
	net := transport.NewMemNetwork()
	dev := madDevice(t, net, "10.0.0.1", nil)
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	cq, err := dev.CreateCQ(16)
	require.NoError(t, err)
	attr := ib.QPInitAttr{Type: ib.GSI, SendCQ: cq, RecvCQ: cq, Cap: ib.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}}
	gsi, err := pd.CreateQP(attr)
	require.NoError(t, err)
	require.Equal(t, uint32(1), gsi.Num())
	_, err = pd.CreateQP(attr)
	require.ErrorIs(t, err, ib.ErrQPNInUse)
	_, err = ib.OpenMADAgent(dev, ib.MADAgentConfig{Handler: func(netip.Addr, netip.Addr, []byte) {}})
	require.ErrorIs(t, err, ib.ErrQPNInUse, "the agent needs QP1")

	require.NoError(t, gsi.Modify(&ib.QPAttr{State: ib.QPSInit, QKey: 0x1234}, ib.AttrState|ib.AttrPKeyIndex|ib.AttrQKey))
	a, _, err := gsi.Query()
	require.NoError(t, err)
	require.Equal(t, uint32(ib.GSIQKey), a.QKey)
	require.Zero(t, a.PKeyIndex)
	err = gsi.Modify(&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState|ib.AttrAV)
	require.Error(t, err, "GSI takes no address vector: it is UD")
	require.NoError(t, gsi.Modify(&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState))
	require.NoError(t, gsi.Modify(&ib.QPAttr{State: ib.QPSRTS}, ib.AttrState|ib.AttrSQPSN))
	require.Error(t, gsi.PostSend(ib.SendWR{Opcode: ib.WRRDMAWrite}), "UD rules: no RDMA WRITE")

	require.NoError(t, gsi.Destroy())
	again, err := pd.CreateQP(attr)
	require.NoError(t, err, "QP1 can be created again after Destroy")
	require.Equal(t, uint32(1), again.Num())
	require.NoError(t, again.Destroy())
}
