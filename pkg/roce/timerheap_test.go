package roce

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// TestTimerHeapOrdersByDeadlineThenQPN drives the heap with seeded random
// inserts, moves (earlier and later) and removals, and after every step
// compares its minimum with a scan of the reference keys.
func TestTimerHeapOrdersByDeadlineThenQPN(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 300
	s := newSide(t, transport.NewMemNetwork(), "10.0.0.1", qp.RC)
	ents := make([]*qpEntry, n)
	for i := range ents {
		q, err := s.e.CreateQP(qp.Config{Type: qp.RC, PD: s.pd, SendCQ: s.scq, RecvCQ: s.rcq, Cap: sideCap})
		require.NoError(t, err)
		ents[i] = &qpEntry{q: q} // not the engine's: the heap alone
	}
	var h timerHeap
	ref := make(map[*qpEntry]time.Time)
	base := time.Unix(1000, 0)
	for step := 0; step < 20000; step++ {
		ent := ents[rng.IntN(n)]
		switch rng.IntN(4) {
		case 0:
			h.remove(ent)
			delete(ref, ent)
		default:
			// Few distinct times, so ties (broken by QPN) are common.
			d := base.Add(time.Duration(rng.IntN(50)) * time.Microsecond)
			h.set(ent, d)
			ref[ent] = d
		}
		require.Equal(t, len(ref), h.len())
		var want *qpEntry
		for e, d := range ref {
			if want == nil || d.Before(ref[want]) || (d.Equal(ref[want]) && e.q.Num() < want.q.Num()) {
				want = e
			}
		}
		require.Same(t, want, h.top(), "step %d", step)
	}
	for h.len() > 0 { // positions stay consistent to the end
		top := h.top()
		require.Equal(t, 1, top.tm.pos)
		h.remove(top)
		require.Zero(t, top.tm.pos)
	}
}

// timerRig is one engine with nqp RC QPs on one worker, driven by a
// FakeClock, whose packets go to a bare peer Conn that records each
// packet's destination QPN: the order in which the QPs' retransmit timers
// fired. The peer never answers, so every send ends in a timeout.
type timerRig struct {
	e     *Engine
	clock *FakeClock
	scq   *qp.CQ
	qps   []*qp.QP
	byDst map[uint32]int // peer-side QPN -> index in qps
	got   chan uint32    // destination QPNs in arrival order
}

const timerRigTimeout = 14 // 4.096 us * 2^14 = 67 ms

func newTimerRig(t *testing.T, nqp int) *timerRig {
	t.Helper()
	net := transport.NewMemNetwork()
	net.QueueLen = 4 * nqp
	clock := NewFakeClock(time.Unix(0, 0))
	la, pa := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.99")
	c, err := net.Listen(netip.AddrPortFrom(la, transport.RoCEv2Port))
	require.NoError(t, err)
	peer, err := net.Listen(netip.AddrPortFrom(pa, transport.RoCEv2Port))
	require.NoError(t, err)
	e, err := New(Config{Conn: c, Workers: 1, Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close(); peer.Close() })
	r := &timerRig{e: e, clock: clock, byDst: make(map[uint32]int), got: make(chan uint32, 4*nqp)}
	go func() {
		bufs := make([][]byte, 16)
		for i := range bufs {
			bufs[i] = make([]byte, 256)
		}
		sizes, eps := make([]int, 16), make([]transport.Endpoint, 16)
		for {
			k, err := peer.Receive(bufs, sizes, eps)
			if err != nil {
				return
			}
			for _, b := range bufs[:k] {
				r.got <- wire.BTH(b[:wire.BTHLen]).DestQP()
			}
		}
	}()
	pd, err := e.Memory().AllocPD()
	require.NoError(t, err)
	r.scq, err = qp.NewCQ(4 * nqp)
	require.NoError(t, err)
	rcq, err := qp.NewCQ(4 * nqp)
	require.NoError(t, err)
	for i := range nqp {
		q := r.createRTS(t, pd, rcq, pa, uint32(0x10000+i))
		r.byDst[uint32(0x10000+i)] = i
		r.qps = append(r.qps, q)
	}
	return r
}

func (r *timerRig) createRTS(t *testing.T, pd *mr.PD, rcq *qp.CQ, peer netip.Addr, dst uint32) *qp.QP {
	t.Helper()
	e := r.e
	q, err := e.CreateQP(qp.Config{Type: qp.RC, PD: pd, SendCQ: r.scq, RecvCQ: rcq,
		Cap: qp.Cap{MaxSendWR: 4, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 16}})
	require.NoError(t, err)
	require.NoError(t, e.ModifyQP(q, &qp.Attr{State: qp.Init, PortNum: 1}, qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags))
	require.NoError(t, e.ModifyQP(q, &qp.Attr{State: qp.RTR, AV: qp.AddrVector{DGID: peer}, PathMTU: qp.MTU1024,
		DestQPN: dst, MaxDestRdAtomic: 1, MinRNRTimer: 1}, qp.AttrState|qp.AttrAV|qp.AttrPathMTU|qp.AttrDestQPN|qp.AttrRQPSN|qp.AttrMaxDestRdAtomic|qp.AttrMinRNRTimer))
	require.NoError(t, e.ModifyQP(q, &qp.Attr{State: qp.RTS, Timeout: timerRigTimeout, RetryCnt: 7, RNRRetry: 0, MaxRdAtomic: 1},
		qp.AttrState|qp.AttrSQPSN|qp.AttrTimeout|qp.AttrRetryCnt|qp.AttrRNRRetry|qp.AttrMaxQPRdAtomic))
	return q
}

// next returns the index of the QP the next packet at the peer is for.
func (r *timerRig) next(t *testing.T) int {
	t.Helper()
	select {
	case d := <-r.got:
		i, ok := r.byDst[d]
		require.True(t, ok, "packet for unknown QPN %#x", d)
		return i
	case <-time.After(20 * time.Second):
		t.Fatal("no packet at the peer within 20s")
		return -1
	}
}

// expect reads len(want) packets and requires them to be for the QPs of
// want, in that order.
func (r *timerRig) expect(t *testing.T, want []int, what string) {
	t.Helper()
	got := make([]int, len(want))
	for k := range got {
		got[k] = r.next(t)
	}
	require.Equal(t, want, got, what)
}

// quiet waits until the worker has handled its timer (it is armed again,
// for a later instant) and requires that the engine sent exactly sent
// packets so far: no timer fired early, none twice.
func (r *timerRig) quiet(t *testing.T, sent uint64) {
	t.Helper()
	require.Eventually(t, func() bool {
		d, ok := r.clock.NextDeadline()
		return ok && d.After(r.clock.Now())
	}, 20*time.Second, time.Millisecond, "the worker's timer is not rearmed")
	_, err := r.e.QueryQP(r.qps[0]) // and whatever it queued is handled
	require.NoError(t, err)
	require.Equal(t, sent, r.e.Counters()["sent_pkts"])
	select {
	case d := <-r.got:
		t.Fatalf("unexpected packet for QP %d", r.byDst[d])
	default:
	}
}

// TestTimersFireInDeadlineOrder4096: 4096 QPs of one worker each send a
// SEND that is never answered, one microsecond of fake time apart in a
// seeded random order, so their retransmit deadlines are 4096 distinct
// instants in that order. Moving time to the deadline of the k-th fires
// exactly the first k, in deadline order (the order their retransmits
// reach the peer); those are re-keyed to a new deadline a timeout later
// (moved behind every other QP), so the next step fires the rest first
// and the re-keyed ones only at their new deadline, by QPN since they
// share it. A QP moved to ERR (deadline cleared without a timer firing)
// and a destroyed QP never fire.
func TestTimersFireInDeadlineOrder4096(t *testing.T) {
	const n = 4096
	r := newTimerRig(t, n)
	order := rand.New(rand.NewPCG(14, 4096)).Perm(n)
	start := r.clock.Now()
	for k, i := range order {
		_, err := r.e.PostSend(r.qps[i], []qp.SendWR{{ID: uint64(i), Opcode: qp.WRSend, Flags: qp.Signaled | qp.Inline, Inline: []byte("t")}})
		require.NoError(t, err)
		require.Equal(t, i, r.next(t), "first send of post %d", k) // sent at this instant
		r.clock.Advance(time.Microsecond)
	}
	step := qp.RetransmitTimeout(timerRigTimeout)
	deadline := func(k int) time.Time { return start.Add(time.Duration(k)*time.Microsecond + step) }

	// The QP posted 100th leaves by ERR, the 101st is destroyed.
	errQP, gone := order[100], order[101]
	require.NoError(t, r.e.ModifyQP(r.qps[errQP], &qp.Attr{State: qp.Err}, qp.AttrState))
	require.NoError(t, r.e.DestroyQP(r.qps[gone]))
	skip := func(i int) bool { return i == errQP || i == gone }
	sent := uint64(n)

	r.clock.Advance(deadline(0).Sub(r.clock.Now()) - time.Nanosecond)
	r.quiet(t, sent)                                    // nothing is due yet
	r.clock.Advance(deadline(n / 2).Sub(r.clock.Now())) // deadlines 0..n/2 are due
	first := slices.DeleteFunc(slices.Clone(order[:n/2+1]), skip)
	r.expect(t, first, "the first half fires in deadline order")
	sent += uint64(len(first))
	fired := r.clock.Now()
	r.quiet(t, sent)

	// The rest fire in order; the first half was re-keyed a timeout after
	// it fired, which is later than every remaining deadline.
	require.True(t, fired.Add(step).After(deadline(n-1)))
	r.clock.Advance(deadline(n - 1).Sub(r.clock.Now()))
	r.expect(t, order[n/2+1:], "the second half fires in deadline order")
	sent += uint64(n - (n/2 + 1))
	r.quiet(t, sent)

	// Their new deadline is one instant: they fire by QPN.
	r.clock.Advance(fired.Add(step).Sub(r.clock.Now()))
	again := slices.Clone(first)
	slices.SortFunc(again, func(a, b int) int { return int(r.qps[a].Num()) - int(r.qps[b].Num()) })
	r.expect(t, again, "re-keyed QPs fire at their new deadline, by QPN")
	sent += uint64(len(again))
	r.quiet(t, sent)

	// The ERR QP's send completed flushed, the destroyed QP's never did.
	var wcs [8]qp.WC
	flushed := 0
	for c := r.scq.Poll(wcs[:]); c > 0; c = r.scq.Poll(wcs[:]) {
		for _, wc := range wcs[:c] {
			require.Equal(t, uint64(errQP), wc.ID)
			require.Equal(t, qp.WCWRFlushErr, wc.Status)
			flushed++
		}
	}
	require.Equal(t, 1, flushed)
}
