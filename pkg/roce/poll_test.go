package roce

import (
	"bytes"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/polltest"
	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// recordConn records every datagram sent, in order, whole or gathered.
type recordConn struct {
	mu    sync.Mutex
	sent  [][]byte
	calls int
}

func (r *recordConn) Receive([][]byte, []int, []transport.Endpoint) (int, error) {
	return 0, net.ErrClosed
}
func (r *recordConn) BatchSize() int { return 64 }
func (r *recordConn) LocalAddrs() []netip.AddrPort {
	return []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:4791")}
}
func (r *recordConn) Close() error { return nil }
func (r *recordConn) Send(bufs [][]byte, _ transport.Endpoint) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	for _, b := range bufs {
		r.sent = append(r.sent, bytes.Clone(b))
	}
	return nil
}
func (r *recordConn) SendGather(dgrams []transport.Gather, _ transport.Endpoint) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	for _, d := range dgrams {
		r.sent = append(r.sent, bytes.Join(d[:], nil))
	}
	return nil
}

// TestFlushSendsRequestsBeforeResponses: a batch that mixes responses
// and requests leaves with the requests first, each kind in its own
// order, whole or gathered; a batch that does not mix keeps its order.
func TestFlushSendsRequestsBeforeResponses(t *testing.T) {
	for _, gather := range []bool{false, true} {
		rc := &recordConn{}
		a := netip.MustParseAddr("127.0.0.1")
		e := &Engine{conn: rc, clock: SystemClock{}, log: slog.New(slog.DiscardHandler),
			gids: []netip.Addr{a}, gidPorts: []uint16{transport.RoCEv2Port}, ports: map[netip.Addr]uint16{a: transport.RoCEv2Port}}
		if gather {
			e.gs = rc
		}
		w := newWorker(e, 0)
		av := &qp.AddrVector{DGID: netip.MustParseAddr("127.0.0.2")}
		send := func(op wire.Opcode, tag byte) {
			const n = wire.BTHLen + 8 + wire.ICRCLen
			buf := w.TxBuffer()
			clear(buf[:n])
			buf[0] = byte(op)
			buf[wire.BTHLen] = tag
			if gather && op == wire.RCSendOnly {
				// A payload sent in place (no region: nothing to release).
				require.NoError(t, w.TransmitPayload(wire.BTHLen, []byte{tag, 0, 0, 0, 0, 0, 0, 0}, mr.Region{}, n, av))
				return
			}
			require.NoError(t, w.Transmit(n, av))
		}
		tags := func() []byte {
			var out []byte
			for _, p := range rc.sent {
				out = append(out, p[wire.BTHLen])
			}
			rc.sent = nil
			return out
		}
		send(wire.RCAck, 0)
		send(wire.RCSendOnly, 1)
		send(wire.RCReadResponseOnly, 2)
		send(wire.RCAck, 3)
		send(wire.RCWriteOnly, 4)
		send(wire.RCAtomicAck, 5)
		send(wire.RCSendOnly, 6)
		w.flush()
		require.Equal(t, []byte{1, 4, 6, 0, 2, 3, 5}, tags(), "gather=%v", gather)
		require.Equal(t, 1, rc.calls, "one batch, one send")

		send(wire.RCSendOnly, 7) // already in order: untouched
		send(wire.RCAck, 8)
		w.flush()
		require.Equal(t, []byte{7, 8}, tags())
		send(wire.RCAck, 9)
		send(wire.RCAck, 10)
		w.flush()
		require.Equal(t, []byte{9, 10}, tags())
		send(wire.RCAck, 11) // a batch reordered before must not leave state behind
		w.flush()
		send(wire.RCSendOnly, 12)
		w.flush()
		require.Equal(t, []byte{11, 12}, tags())
		// The sealed ICRC still matches each packet after the move.
		send(wire.RCAck, 13)
		send(wire.RCSendOnly, 14)
		w.flush()
		flow := wire.Flow{Src: netip.AddrPortFrom(a, transport.RoCEv2Port), Dst: netip.AddrPortFrom(av.DGID, transport.RoCEv2Port)}
		for _, p := range rc.sent {
			v, _ := flow.Verify(p)
			require.Equal(t, wire.ICRCOK, v)
		}
		require.Equal(t, []byte{14, 13}, tags())
	}
}

// newUDPSide is newSide over a loopback UDP socket (ephemeral port);
// pollOnly makes Progress its only receiver.
func newUDPSide(t *testing.T, addr string, pollOnly bool) *side {
	t.Helper()
	a := netip.MustParseAddr(addr)
	uc, err := transport.OpenUDP(transport.UDPConfig{Addrs: []netip.Addr{a}})
	require.NoError(t, err)
	c := uc
	if pollOnly {
		c, err = polltest.Only(uc)
		require.NoError(t, err)
	}
	return sideOn(t, c, a, qp.RC, sideCap)
}

// connectUDP is connect for sides on ephemeral ports, with a 4.3 s ACK
// timeout: a side that receives only while the test polls it may leave
// an ACK in its socket for a while on a loaded machine.
func connectUDP(t *testing.T, a, b *side) {
	t.Helper()
	for _, p := range [][2]*side{{a, b}, {b, a}} {
		l, r := p[0], p[1]
		require.NoError(t, l.e.ModifyQP(l.q, &qp.Attr{State: qp.Init, PortNum: 1, AccessFlags: allRemote},
			qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags))
		require.NoError(t, l.e.ModifyQP(l.q, &qp.Attr{State: qp.RTR,
			AV:      qp.AddrVector{DGID: r.addr, DestPort: r.e.Port(r.addr)},
			PathMTU: qp.MTU1024, DestQPN: r.q.Num(), RQPSN: 100, MaxDestRdAtomic: 16, MinRNRTimer: 1},
			qp.AttrState|qp.AttrAV|qp.AttrPathMTU|qp.AttrDestQPN|qp.AttrRQPSN|qp.AttrMaxDestRdAtomic|qp.AttrMinRNRTimer))
		require.NoError(t, l.e.ModifyQP(l.q, &qp.Attr{State: qp.RTS, SQPSN: 100, Timeout: 20,
			RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
			qp.AttrState|qp.AttrSQPSN|qp.AttrTimeout|qp.AttrRetryCnt|qp.AttrRNRRetry|qp.AttrMaxQPRdAtomic))
	}
}

// pollWC spins on cq, driving e's progress, as ib.CQ.Poll does.
func pollWC(t *testing.T, e *Engine, cq *qp.CQ) (qp.WC, int) {
	t.Helper()
	return spinForWC(t, cq, e.Progress)
}

// spinForWC spins on cq, calling progress between empty polls, until a
// completion comes (failing the test after 10 s); it returns it and the
// packets progress took.
func spinForWC(t *testing.T, cq *qp.CQ, progress func() int) (qp.WC, int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var wc [1]qp.WC
	took := 0
	for cq.Poll(wc[:]) == 0 {
		took += progress()
		if time.Now().After(deadline) {
			t.Fatalf("no completion within 10s (progress took %d packets)", took)
		}
		runtime.Gosched()
	}
	return wc[0], took
}

// TestProgressReceivesForAPoller: on an engine whose receive goroutine
// gets nothing, Progress alone receives: SENDs complete at the polling
// side, its ACKs reach the sender although the poller never posts an
// answer (the worker's timer sends what the poller left in the batch
// keepSpan later: the test polls no more until then), and a
// ping-pong where the poller answers every message delivers each one
// once, intact.
func TestProgressReceivesForAPoller(t *testing.T) {
	a := newUDPSide(t, "127.0.0.1", false)
	b := newUDPSide(t, "127.0.0.1", true)
	connectUDP(t, a, b)
	amr, abuf := regMR(t, a, 4096)
	bmr, bbuf := regMR(t, b, 4096)

	const rounds = 200
	for i := range rounds {
		_, err := b.e.PostRecv(b.q, []qp.RecvWR{{ID: uint64(i), SGL: []qp.SGE{{Addr: bmr.IOVA() + uint64(i%8)*64, Length: 64, LKey: bmr.LKey()}}}})
		require.NoError(t, err)
		_, err = a.e.PostRecv(a.q, []qp.RecvWR{{ID: uint64(i), SGL: []qp.SGE{{Addr: amr.IOVA() + 1024 + uint64(i%8)*64, Length: 64, LKey: amr.LKey()}}}})
		require.NoError(t, err)
	}

	// One signalled SEND that the poller does not answer.
	copy(abuf, "first message")
	_, err := a.e.PostSend(a.q, []qp.SendWR{{ID: 1, Opcode: qp.WRSend, Flags: qp.Signaled,
		SGL: []qp.SGE{{Addr: amr.IOVA(), Length: 13, LKey: amr.LKey()}}}})
	require.NoError(t, err)
	wc, took := pollWC(t, b.e, b.rcq)
	require.Equal(t, qp.WCSuccess, wc.Status)
	require.EqualValues(t, 13, wc.ByteLen)
	require.Equal(t, "first message", string(bbuf[:13]))
	require.Positive(t, took, "only Progress can have received it")
	wc = waitWC(t, a.scq) // needs b's ACK, which nobody but b's worker (its timer) sends
	require.Equal(t, qp.WCSuccess, wc.Status)
	require.EqualValues(t, 1, wc.ID)

	// Ping-pong: a sends i, b's poller answers with 1000+i.
	for i := 1; i < rounds; i++ {
		msg := []byte{byte(i), byte(i >> 8), 'p', 'i', 'n', 'g'}
		_, err := a.e.PostSend(a.q, []qp.SendWR{{ID: uint64(i), Opcode: qp.WRSend, Flags: qp.Inline, Inline: msg}})
		require.NoError(t, err)
		wc, _ := pollWC(t, b.e, b.rcq)
		require.Equal(t, qp.WCSuccess, wc.Status)
		require.EqualValues(t, i, wc.ID, "receives complete in order")
		off := (i % 8) * 64
		require.Equal(t, msg, bbuf[off:off+len(msg)])
		ans := []byte{byte(i), byte(i >> 8), 'p', 'o', 'n', 'g'}
		_, err = b.e.PostSend(b.q, []qp.SendWR{{ID: uint64(i), Opcode: qp.WRSend, Flags: qp.Inline, Inline: ans}})
		require.NoError(t, err)
		wc = waitWC(t, a.rcq)
		require.Equal(t, qp.WCSuccess, wc.Status)
		require.EqualValues(t, i-1, wc.ID)
		off = 1024 + ((i-1)%8)*64
		require.Equal(t, ans, abuf[off:off+len(ans)])
	}
	// Each side sends its 200 messages (199 answers for b) and one ACK
	// per message it received, and receives everything the other sent (a's
	// last ACK only when b polls again; a's ACK may leave after a's
	// completion, in the answer window).
	const want = 2*rounds - 1
	deadline := time.Now().Add(10 * time.Second)
	var ca, cb map[string]uint64
	for {
		b.e.Progress()
		ca, cb = a.e.Counters(), b.e.Counters()
		if ca["sent_pkts"] == want && cb["sent_pkts"] == want && cb["rcvd_pkts"] == want && ca["rcvd_pkts"] == want {
			break
		}
		require.False(t, time.Now().After(deadline), "a sent %d, b received %d; b sent %d, a received %d (want %d each)",
			ca["sent_pkts"], cb["rcvd_pkts"], cb["sent_pkts"], ca["rcvd_pkts"], want)
		runtime.Gosched()
	}
	for r := qp.DropReason(1); int(r) < qp.NumDropReasons; r++ {
		require.Zero(t, b.e.Drops(r), "drops for %v", r)
	}
	require.Zero(t, ca["completer_retry_err"]+cb["completer_retry_err"], "no retransmission was needed")
}

// TestProgressNeedsAPollableConn: an engine over an in-memory Conn
// receives in its own goroutine only; Progress finds nothing to do.
func TestProgressNeedsAPollableConn(t *testing.T) {
	net := transport.NewMemNetwork()
	s := newSide(t, net, "10.0.0.1", qp.RC)
	require.Zero(t, s.e.Progress())
	require.Nil(t, s.e.poller)
}

// TestKeptBatchLeavesWithTheAnswerTheNextPollOrTheTimer: the ACK of a
// SEND that a poller completed waits in the batch for the application's
// answer, and leaves with the first of: that answer (one send of both),
// the next poll (one that receives more finds the batch kept and sends
// it; an empty one sends kept batches, Engine.sendKept), or the worker's
// timer keepSpan later. Before, the poller woke the worker at once
// (evWake), which a SEND ping-pong paid for every round trip
// (docs/performance.md, session S); the fake clock here shows that
// nothing but those sends it.
func TestKeptBatchLeavesWithTheAnswerTheNextPollOrTheTimer(t *testing.T) {
	a := newUDPSide(t, "127.0.0.1", false)
	clock := NewFakeClock(time.Unix(1000, 0))
	uc, err := transport.OpenUDP(transport.UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
	require.NoError(t, err)
	c, err := polltest.Only(uc) // b receives only in Progress
	require.NoError(t, err)
	b := sideWith(t, Config{Conn: c, Workers: 1, IBATimerOnly: true, Clock: clock}, netip.MustParseAddr("127.0.0.1"), qp.RC, sideCap)
	connectUDP(t, a, b)
	bmr, _ := regMR(t, b, 4096)
	for i := range 16 {
		_, err := b.e.PostRecv(b.q, []qp.RecvWR{{ID: uint64(i), SGL: []qp.SGE{{Addr: bmr.IOVA() + uint64(i)*64, Length: 64, LKey: bmr.LKey()}}}})
		require.NoError(t, err)
	}
	amr, _ := regMR(t, a, 4096)
	_, err = a.e.PostRecv(a.q, []qp.RecvWR{{ID: 1, SGL: []qp.SGE{{Addr: amr.IOVA(), Length: 64, LKey: amr.LKey()}}}})
	require.NoError(t, err)
	// b's worker goroutine may still own the shard after the last
	// ModifyQP returned (finishing its round); a packet arriving then
	// would be queued to it, not handled by the poller. With the fake
	// clock nothing wakes it again once it has let go.
	idle := b.e.workers[0]
	require.Eventually(t, func() bool {
		if !idle.own.TryLock() {
			return false
		}
		idle.own.Unlock()
		return true
	}, 10*time.Second, time.Microsecond)
	send := func(id uint64) {
		t.Helper()
		_, err := a.e.PostSend(a.q, []qp.SendWR{{ID: id, Opcode: qp.WRSend, Flags: qp.Signaled | qp.Inline, Inline: []byte("ping")}})
		require.NoError(t, err)
		wc, _ := pollWC(t, b.e, b.rcq)
		require.Equal(t, qp.WCSuccess, wc.Status)
	}
	// Datagrams b's socket sent (sent_pkts counts packets as they are built).
	stats, ok := uc.(transport.StatsReporter)
	require.True(t, ok)
	sent := func() uint64 { return stats.Stats().SentPackets }
	acked := func(id uint64) {
		t.Helper()
		wc := waitWC(t, a.scq)
		require.Equal(t, qp.WCSuccess, wc.Status)
		require.Equal(t, id, wc.ID)
	}

	// Nobody answers: the timer sends the ACK, and nothing before it.
	send(1)
	require.Zero(t, sent(), "the ACK waits for an answer")
	at, ok := clock.NextDeadline()
	require.True(t, ok, "the worker's timer is armed for the kept batch")
	require.Equal(t, clock.Now().Add(keepSpan), at)
	clock.Advance(keepSpan - time.Nanosecond)
	require.Zero(t, sent())
	clock.Advance(time.Nanosecond)
	acked(1)
	// The worker's flush counts the datagram after its system call, which
	// a's completion may beat.
	require.Eventually(t, func() bool { return sent() == 1 }, 10*time.Second, time.Millisecond)
	_, ok = clock.NextDeadline()
	require.False(t, ok, "nothing kept, nothing outstanding: the timer is stopped")

	// A poll that finds nothing sends it.
	send(2)
	require.EqualValues(t, 1, sent())
	require.Zero(t, b.e.Progress(), "nothing more to receive")
	require.EqualValues(t, 2, sent(), "the empty poll sent the kept batch")
	acked(2)
	_, ok = clock.NextDeadline()
	require.False(t, ok)

	// A second receive finds the batch kept and sends it, with its own ACK.
	send(3)
	require.EqualValues(t, 2, sent())
	send(4)
	acked(3)
	acked(4)
	require.Greater(t, sent(), uint64(2), "the second receive sent the kept batch")
	_, ok = clock.NextDeadline()
	require.False(t, ok)

	// A poll that takes a longer batch than inlineBatch (a stream) keeps
	// nothing: the ACKs leave at once.
	before := sent()
	burst := make([]qp.SendWR, inlineBatch+2)
	for i := range burst {
		burst[i] = qp.SendWR{ID: uint64(10 + i), Opcode: qp.WRSend, Flags: qp.Signaled | qp.Inline, Inline: []byte("stream")}
	}
	_, err = a.e.PostSend(a.q, burst)
	require.NoError(t, err)
	var took int
	require.Eventually(t, func() bool { took += b.e.Progress(); return took == len(burst) }, 10*time.Second, time.Microsecond)
	require.Greater(t, sent(), before, "the burst's ACKs left in the poll that took it")
	for i := range burst {
		acked(uint64(10 + i))
	}
	var wcs [16]qp.WC
	require.Equal(t, len(burst), b.rcq.Poll(wcs[:]))
	_, ok = clock.NextDeadline()
	require.False(t, ok)

	// The answer takes the ACK with it: one send of both, no timer.
	before = sent()
	send(5)
	require.Equal(t, before, sent())
	_, err = b.e.PostSend(b.q, []qp.SendWR{{ID: 9, Opcode: qp.WRSend, Flags: qp.Inline, Inline: []byte("pong")}})
	require.NoError(t, err)
	require.Equal(t, before+2, sent(), "the answer and the kept ACK left in the post")
	acked(5)
	wc := waitWC(t, a.rcq)
	require.Equal(t, qp.WCSuccess, wc.Status)
}
