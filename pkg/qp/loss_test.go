package qp

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// A deterministic lossy wire between two RC QPs: every packet either
// side builds is dropped with probability loss (seeded), the rest are
// delivered in order; when nothing is in flight, time jumps to the
// earliest armed timer. retry_cnt 7 with retransmit timeouts must ride
// out 5% loss: eight losses in a row of the same packet have a
// probability of 4e-11.

type lossySim struct {
	t    *testing.T
	l    *link
	rng  *rand.Rand
	loss float64
	// onWC is called for every completion (either side, either CQ).
	onWC func(e *end, wc WC, recv bool)
	fail []string
}

func newLinkMTU(t *testing.T, mtu MTU) *link {
	l := &link{t: t, a: newEnd(t, RC, 0x11, "10.0.0.1"), b: newEnd(t, RC, 0x12, "10.0.0.2"), now: time.Unix(1000, 0)}
	for _, p := range [][2]*end{{l.a, l.b}, {l.b, l.a}} {
		x, y := p[0], p[1]
		require.NoError(t, x.q.Modify(&Attr{State: Init, PortNum: 1,
			AccessFlags: AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic},
			AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags, l.now))
		require.NoError(t, x.q.Modify(&Attr{State: RTR, AV: AddrVector{DGID: y.addr.Addr()}, PathMTU: mtu,
			DestQPN: y.q.Num(), RQPSN: 0xFFFF00, MaxDestRdAtomic: 16, MinRNRTimer: 3},
			AttrState|AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRdAtomic|AttrMinRNRTimer, l.now))
		require.NoError(t, x.q.Modify(&Attr{State: RTS, SQPSN: 0xFFFF00, Timeout: 14, RetryCnt: 7,
			RNRRetry: 7, MaxRdAtomic: 16},
			AttrState|AttrSQPSN|AttrTimeout|AttrRetryCnt|AttrRNRRetry|AttrMaxQPRdAtomic, l.now))
	}
	return l
}

// lossRate is the per-packet loss of the lossy tests.
var lossRate = 0.05

type simPkt struct {
	dst, src *end
	raw      []byte
}

// run drives the link until done reports true; it reports false when the
// step budget ran out (a stall).
func (s *lossySim) run(done func() bool) bool {
	l := s.l
	var inflight []simPkt
	collect := func(src, dst *end) {
		for _, p := range src.env.take() {
			if s.rng.Float64() < s.loss {
				continue
			}
			inflight = append(inflight, simPkt{dst: dst, src: src, raw: p})
		}
	}
	drain := func() {
		for _, e := range []*end{l.a, l.b} {
			for _, cq := range []*CQ{e.scq, e.rcq} {
				for _, wc := range poll(s.t, cq) {
					s.onWC(e, wc, cq == e.rcq)
				}
			}
		}
	}
	for step := 0; step < 2_000_000; step++ {
		drain()
		if done() || len(s.fail) > 0 {
			return true
		}
		l.a.q.Run(l.a.env, l.now, 64)
		l.b.q.Run(l.b.env, l.now, 64)
		collect(l.a, l.b)
		collect(l.b, l.a)
		if len(inflight) > 0 {
			p := inflight[0]
			inflight = inflight[1:]
			var pk wire.Packet
			require.NoError(s.t, pk.Parse(p.raw))
			ri := RecvInfo{Src: p.src.addr, Dst: p.dst.addr}
			if p.dst.q.Check(&pk, &ri, p.dst.addr.Addr()) == DropNone {
				p.dst.q.Receive(p.dst.env, &pk, &ri, l.now)
			}
			l.now = l.now.Add(time.Microsecond)
			continue
		}
		// Nothing in flight: the next event is a timer.
		d := l.a.q.Deadline()
		if db := l.b.q.Deadline(); !db.IsZero() && (d.IsZero() || db.Before(d)) {
			d = db
		}
		if d.IsZero() {
			drain()
			return done() || len(s.fail) > 0
		}
		if d.After(l.now) {
			l.now = d
		}
		l.a.q.OnTimer(l.a.env, l.now, 64)
		l.b.q.OnTimer(l.b.env, l.now, 64)
	}
	return false
}

// TestRCPingpongMultiPacketUnderLoss is `rxed pingpong -s 3000 -m
// 1024 --fault loss=0.05` on both sides: SEND ping, SEND pong.
//
// Regression test: was TestRegressRCPingpongMultiPacketUnderLoss in regress_loss_test.go
// (added in commit 97940c9).
func TestRCPingpongMultiPacketUnderLoss(t *testing.T) {
	const size, iters = 3000, 60
	for seed := uint64(1); seed <= 60; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			l := newLinkMTU(t, MTU1024)
			for i := range 64 {
				require.NoError(t, l.a.q.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{l.a.sge(1<<19, size)}}))
				require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{l.b.sge(1<<19, size)}}))
			}
			send := func(e, peer *end, id uint64) {
				require.NoError(t, e.q.PostSend(&SendWR{ID: id, Opcode: WRSend, Flags: Signaled, SGL: []SGE{e.sge(0, size)}}))
			}
			pongs := 0
			s := &lossySim{t: t, l: l, rng: rand.New(rand.NewPCG(seed, 99)), loss: lossRate}
			s.onWC = func(e *end, wc WC, recv bool) {
				if wc.Status != WCSuccess {
					s.fail = append(s.fail, fmt.Sprintf("qp %#x: %v (recv %v)", e.q.Num(), wc.Status, recv))
					return
				}
				if !recv {
					return
				}
				require.NoError(t, e.q.PostRecv(&RecvWR{ID: wc.ID, SGL: []SGE{e.sge(1<<19, size)}}))
				if e == l.b {
					send(l.b, l.a, wc.ID)
				} else if pongs++; pongs < iters {
					send(l.a, l.b, wc.ID)
				}
			}
			send(l.a, l.b, 0)
			require.True(t, s.run(func() bool { return pongs >= iters }), "stalled after %d pongs", pongs)
			require.Empty(t, s.fail)
			require.Equal(t, iters, pongs)
		})
	}
}

// TestRCBulkUnderLoss is read_bw / write_bw with 65536-byte
// messages, MTU 1024, 2% and 5% loss on both directions, several
// outstanding.
//
// Regression test: was TestRegressRCBulkUnderLoss in regress_loss_test.go
// (added in commit 97940c9).
func TestRCBulkUnderLoss(t *testing.T) {
	const total, window = 24, 4
	for _, op := range []WROpcode{WRRDMARead, WRRDMAWrite} {
		for _, loss := range []float64{0.02, lossRate} {
			for seed := uint64(1); seed <= 12; seed++ {
				t.Run(fmt.Sprintf("%v/%v/%d", op, loss, seed), func(t *testing.T) {
					runBulk(t, bulkRun{op: op, mtu: MTU1024, loss: loss, seed: seed, stream: 7, n: total, window: window})
				})
			}
		}
	}
}

// bulkRun is read_bw / write_bw over the lossy wire: n messages of 64 KiB,
// window of them outstanding, each completing in order (READ data checked
// against the source).
type bulkRun struct {
	op           WROpcode
	mtu          MTU
	loss         float64
	seed, stream uint64
	n, window    int
}

// runBulk runs r and returns the virtual time it took and the
// requester's counters.
func runBulk(t *testing.T, r bulkRun) (time.Duration, *Counters) {
	t.Helper()
	const size = 64 << 10
	l := newLinkMTU(t, r.mtu)
	for i := range size {
		l.b.buf[i] = byte(i*31 + 7)
	}
	posted, done := 0, 0
	post := func() {
		slot := posted % r.window
		require.NoError(t, l.a.q.PostSend(&SendWR{ID: uint64(posted), Opcode: r.op, Flags: Signaled,
			SGL: []SGE{l.a.sge(slot*size, size)}, RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()}))
		posted++
	}
	s := &lossySim{t: t, l: l, rng: rand.New(rand.NewPCG(r.seed, r.stream)), loss: r.loss}
	s.onWC = func(e *end, wc WC, recv bool) {
		if wc.Status != WCSuccess {
			s.fail = append(s.fail, fmt.Sprintf("qp %#x: wr %d: %v", e.q.Num(), wc.ID, wc.Status))
			return
		}
		require.Equal(t, uint64(done), wc.ID, "in order")
		if r.op == WRRDMARead {
			slot := int(wc.ID) % r.window
			require.Equal(t, l.b.buf[:size], l.a.buf[slot*size:(slot+1)*size], "READ data of wr %d", wc.ID)
			clear(l.a.buf[slot*size : (slot+1)*size])
		}
		done++
		if posted < r.n {
			post()
		}
	}
	for range r.window {
		post()
	}
	t0 := l.now
	require.True(t, s.run(func() bool { return done >= r.n }), "stalled after %d", done)
	require.Empty(t, s.fail, "counters: retry %d timeouts %d seqerr %d",
		l.a.q.ctr.CompleterRetryErr.Load(), l.a.q.ctr.RetransmitTimeouts.Load(), l.a.q.ctr.RcvdSeqErr.Load())
	require.Equal(t, r.n, done)
	return l.now.Sub(t0), l.a.q.ctr
}
