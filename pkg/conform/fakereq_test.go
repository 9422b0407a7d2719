package conform

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/wire"
)

// fakeRequester plays ibv_rc_pingpong's client on loopback for judging the
// requester scenarios' verdict logic: it sends one SEND ONLY and resends it
// on its local ACK timer (T after each transmission) until it is ACKed.
// With honourNAK it resends at once on a sequence NAK, as IBA 9.7.5.2.2
// requires; without, it ignores NAKs and only its timer resends.
type fakeRequester struct {
	pc   *net.UDPConn
	flow wire.Flow // requester -> engine
	t    time.Duration

	honourNAK bool
	// late delays the first retransmission by this much more (a peer
	// descheduled once: an emulated guest under load).
	late time.Duration
	// rnrRetry, if not 0, is the requester's finite rnr_retry: after that
	// many retries answered by RNR NAKs it gives up (sends nothing more).
	rnrRetry int

	mu    sync.Mutex
	acked bool
	rnrs  int // RNR NAKs received
	done  chan struct{}
	wg    sync.WaitGroup
}

// fakeRequesterConn binds the fake requester's socket on 127.0.0.2 and
// opens the engine's side (a Conn as Accept leaves it, its link on clk)
// towards it; the peer's first request is expected at psn.
func fakeRequesterConn(t *testing.T, clk linkClock, psn uint32, tune ...func(*Config)) (*Conn, *net.UDPConn, wire.Flow) {
	t.Helper()
	pc, peer, port := bindFakePeer(t)
	cfg := &Config{Tool: IBVRCPingpong, Local: loopback, Peer: peer, RoCEPort: port, Serve: true, PeerIters: 1}
	for _, f := range tune {
		f(cfg)
	}
	cfg.defaults()
	l, err := openLinkClock(netip.AddrPortFrom(loopback, port), netip.AddrPortFrom(peer, port), clk)
	require.NoError(t, err)
	c := &Conn{Link: l, Cfg: cfg, Tool: IBVRCPingpong, OurQPN: 0x2323, PeerQPN: 0x1717, PSN: 0x900, MTU: 1024,
		srv: &serveState{ePSN: psn, atomics: map[uint32]uint64{}, words: map[uint64]uint64{}}}
	l.ourQPN, l.peerQPN = c.OurQPN, c.PeerQPN
	return c, pc, wire.Flow{Src: netip.AddrPortFrom(peer, port), Dst: netip.AddrPortFrom(loopback, port)}
}

// bindFakePeer binds a UDP socket for a fake peer on 127.0.0.2, at a
// port free on both addresses (the link binds loopback at the same one).
func bindFakePeer(t *testing.T) (*net.UDPConn, netip.Addr, uint16) {
	t.Helper()
	peer := netip.MustParseAddr("127.0.0.2")
	for range 20 {
		_, port := freePorts(t)
		if c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(peer, port))); err == nil {
			return c, peer, port
		}
	}
	t.Fatal("binding 127.0.0.2")
	return nil, netip.Addr{}, 0
}

// runFakeRequester runs requester scenario id against a fakeRequester.
func runFakeRequester(t *testing.T, id string, honourNAK bool, late time.Duration, tune ...func(*Config)) Outcome {
	t.Helper()
	s, err := Lookup(id)
	require.NoError(t, err)
	const psn = 0x500
	c, pc, flow := fakeRequesterConn(t, realClock{}, psn, tune...)
	cfg, l := c.Cfg, c.Link
	f := &fakeRequester{pc: pc, flow: flow, t: c.ackTimeout(), honourNAK: honourNAK, late: late, done: make(chan struct{})}
	if cfg.PeerRNRRetry < 7 { // 7: infinite
		f.rnrRetry = cfg.PeerRNRRetry
	}
	t.Cleanup(func() {
		close(f.done)
		_ = pc.Close()
		_ = l.Close()
		f.wg.Wait()
	})
	h := wire.Headers{Opcode: wire.RCSendOnly, PKey: DefaultPKey, DestQP: c.OurQPN, PSN: psn, AckReq: true}
	pkt := make([]byte, h.Len(64))
	_, err = h.Encode(pkt, pattern(64, 1))
	require.NoError(t, err)
	f.flow.Seal(pkt)
	f.wg.Add(1)
	go f.run(pkt, psn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.Run(ctx, c)
}

// run transmits pkt, then again T after each transmission (or at once on
// a sequence NAK when honourNAK) until an ACK covers psn.
func (f *fakeRequester) run(pkt []byte, psn uint32) {
	defer f.wg.Done()
	nak := make(chan time.Duration, 16) // resend after this
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		buf := make([]byte, 65536)
		for {
			n, _, err := f.pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			var p wire.Packet
			if p.Parse(buf[:n]) != nil || p.AETH == nil {
				continue
			}
			switch syn := p.AETH.Syndrome(); {
			case syn.Kind() == wire.SynACK && p.BTH.PSN() == psn:
				f.mu.Lock()
				f.acked = true
				f.mu.Unlock()
			case syn.Kind() == wire.SynNAK && syn.NAKCode() == wire.NAKPSNSeqErr && f.honourNAK:
				nak <- 0
			case syn.Kind() == wire.SynRNR:
				f.mu.Lock()
				f.rnrs++
				f.mu.Unlock()
				nak <- rnrDelay(syn.RNRTimer())
			}
		}
	}()
	wait := time.Duration(0)
	for range 16 {
		select {
		case <-time.After(wait):
		case <-f.done:
			return
		}
		f.mu.Lock()
		acked, exceeded := f.acked, f.rnrRetry > 0 && f.rnrs > f.rnrRetry
		f.mu.Unlock()
		if acked || exceeded {
			return
		}
		_, _ = f.pc.WriteToUDPAddrPort(pkt, f.flow.Dst)
		select {
		case <-time.After(f.t):
			wait = 0
		case d := <-nak:
			wait = d
		case <-f.done:
			return
		}
		wait += f.late
		f.late = 0
	}
}

// TestGoBackJudgesTheResendFromItsTransmission: Q-SEQ-GOBACK against a
// requester with one message outstanding (ibv_rc_pingpong). The scenario
// waits T/4 for a second packet before it NAKs, so a requester that
// ignores the NAK resends on its timer only 3/4 T after the NAK. Bug (found
// by the conformance audit, session AF): the verdict measured the resend
// from the NAK and called anything sooner than T "driven by the NAK", so
// that requester PASSed; the timer runs from the transmission.
func TestGoBackJudgesTheResendFromItsTransmission(t *testing.T) {
	o := runFakeRequester(t, "Q-SEQ-GOBACK", true, 0)
	require.Equal(t, Pass, o.Verdict, o.Evidence)
	o = runFakeRequester(t, "Q-SEQ-GOBACK", false, 0)
	require.Equal(t, Fail, o.Verdict, o.Evidence)
	require.Contains(t, o.Evidence, "its timer, not the NAK")
}

// TestRequesterCasesWaitForADescheduledPeer: a requester whose first
// retransmission leaves 500 ms late (descheduled once; its timers are
// right) gets the verdict an undisturbed one gets. Bug (found by the
// conformance audit, session AF): Q-GHOST-ACK, Q-RNR-TIMER, Q-RNR-INFINITE
// and Q-RNR-NOT-EXCEEDED awaited the retransmission they need for quietFor
// (368 ms at timeout 14) and FAILed it ("taken as an acknowledgement",
// "gave up after 0 RNR NAKs"), while Q-TIMEOUT-RETRY and Q-SEQ-LIMIT-OK
// waited patience, as docs/conform.md says every such scenario does.
func TestRequesterCasesWaitForADescheduledPeer(t *testing.T) {
	for _, id := range []string{"Q-GHOST-ACK", "Q-RNR-TIMER", "Q-RNR-INFINITE", "Q-RNR-NOT-EXCEEDED", "Q-TIMEOUT-RETRY", "Q-SEQ-LIMIT-OK"} {
		t.Run(id, func(t *testing.T) {
			t.Parallel()
			o := runFakeRequester(t, id, true, 500*time.Millisecond)
			require.Equal(t, Pass, o.Verdict, o.Evidence)
		})
	}
}

// TestRNRExceededCountsALateRetransmission: Q-RNR-EXCEEDED against a
// requester with rnr_retry 3 whose first retransmission leaves 500 ms
// late gets the verdict an undisturbed one gets: the four transmissions
// are all counted. Bug (found by the conformance audit, session AF, as in
// TestRequesterCasesWaitForADescheduledPeer): the count ended at the
// first silence longer than quietFor (368 ms), one transmission in.
func TestRNRExceededCountsALateRetransmission(t *testing.T) {
	rnr3 := func(c *Config) { c.PeerRNRRetry = 3 }
	for name, late := range map[string]time.Duration{"undisturbed": 0, "late": 500 * time.Millisecond} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			o := runFakeRequester(t, "Q-RNR-EXCEEDED", true, late, rnr3)
			require.Equal(t, Pass, o.Verdict, o.Evidence)
		})
	}
}
