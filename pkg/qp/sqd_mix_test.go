package qp

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// TestSQDSeededMixes checks SQD against an outside model on seeded
// random runs: a mix of SENDs, WRITEs and READs is posted, the requester
// gets a random packet budget, the QP moves to SQD with notify while
// requests and responses are in flight, and from then on packets are
// lost at random both ways (retransmit timers recover them). The model
// knows each WR's PSN range, so from the highest PSN sent before SQD it
// knows which WRs had started. It requires that during SQD no request
// of a WR that had not started leaves, that exactly the started WRs
// complete (in order, successfully) before the drain ends, that the
// event fires once, after their completions, and that after SQD->RTS the
// rest complete with the right data at both ends.
func TestSQDSeededMixes(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { sqdMix(t, seed) })
	}
}

func sqdMix(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x5ad))
	l := newLink(t, RC, 7, 7)
	w := watchDrain(t, l.a)
	const (
		slot       = 1024
		remoteBase = 0x10000
		recvBase   = 0x40000
		psn0       = PSN(0xFFFFFE) // newLink's SQ PSN: the wrap is crossed
		loss       = 0.15
	)
	for i := range l.a.buf[:0x20000] {
		l.a.buf[i] = byte(rng.Uint32())
	}
	for i := range l.b.buf[:0x20000] {
		l.b.buf[i] = byte(rng.Uint32())
	}
	n := 6 + rng.IntN(10)
	wrs := make([]SendWR, n)
	first := make([]PSN, n+1) // first[i]: WR i's first PSN; first[n]: the next free one
	first[0] = psn0
	var sends []int // lengths of the SENDs, in order
	total := 0      // request packets of the whole mix
	for i := range wrs {
		size := 1 + rng.IntN(700)
		op := []WROpcode{WRSend, WRRDMAWrite, WRRDMARead}[rng.IntN(3)]
		wrs[i] = SendWR{ID: uint64(i), Opcode: op, Flags: Signaled, SGL: []SGE{l.a.sge(i*slot, size)},
			RemoteAddr: l.b.m.IOVA() + remoteBase + uint64(i*slot), RKey: l.b.m.RKey()}
		if op == WRSend {
			sends = append(sends, size)
			require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{l.b.sge(recvBase+len(sends)*slot, slot)}}))
		}
		pk := pktCount(size, 256)
		first[i+1] = first[i].Add(uint32(pk))
		if op != WRRDMARead {
			total += pk
		} else {
			total++
		}
	}
	for i := range wrs {
		require.NoError(t, l.a.q.PostSend(&wrs[i]))
	}

	// Before SQD: a random part of the mix goes out; some of it reaches
	// the peer, whose answers are held back until after the transition.
	l.a.q.Run(l.a.env, l.now, 1+rng.IntN(total))
	out := l.a.env.take()
	require.NotEmpty(t, out)
	highest := psn0.Prev()
	for _, p := range out {
		if last := requestLastPSN(t, p); last.Diff(highest) > 0 {
			highest = last
		}
	}
	started := 0
	for started < n && first[started].Diff(highest) <= 0 {
		started++
	}
	var held [][]byte
	for _, p := range out {
		if rng.Float64() >= loss {
			l.deliver(l.b, l.a, p)
			held = append(held, l.b.env.take()...)
		}
	}

	toSQD(t, l, l.a, true)
	end := first[started] // no request at or past it may leave in SQD
	exchange := func(pending [][]byte, inSQD bool) bool {
		moved := len(pending) > 0
		for _, p := range pending {
			if rng.Float64() >= loss {
				l.deliver(l.a, l.b, p)
			}
		}
		for range 4 {
			reqs := l.a.env.take()
			if len(reqs) == 0 {
				break
			}
			moved = true
			for _, p := range reqs {
				if inSQD {
					require.Negative(t, requestLastPSN(t, p).Diff(end),
						"request %v of a WR that had not started left in SQD (started %d of %d)",
						PSN(wire.BTH(p).PSN()), started, n)
				}
				if rng.Float64() >= loss {
					l.deliver(l.b, l.a, p)
				}
			}
			for _, p := range l.b.env.take() {
				if rng.Float64() >= loss {
					l.deliver(l.a, l.b, p)
				}
			}
		}
		return moved
	}
	// The drain: packets move (and the retransmit timer fires whenever
	// nothing is left in flight) until sq_draining drops.
	pending := held
	for iter := 0; draining(l.a); iter++ {
		require.Less(t, iter, 2000, "no progress (started %d of %d)", started, n)
		require.Zero(t, w.events, "no event while draining")
		if !exchange(pending, true) {
			d := l.a.q.Deadline()
			require.False(t, d.IsZero(), "stuck with no timer armed")
			l.now = d
			l.a.q.OnTimer(l.a.env, l.now, 1000)
		}
		pending = nil
		require.Equal(t, SQD, l.a.q.State())
	}
	require.Equal(t, 1, w.events)
	require.Equal(t, []int{started}, w.cqAtEvt)
	t.Logf("%d WRs, %d started before SQD, %d retransmit timeouts during the drain", n, started,
		l.a.q.ctr.RetransmitTimeouts.Load())
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, started)
	for i, wc := range wcs {
		require.Equal(t, uint64(i), wc.ID)
		require.Equal(t, WCSuccess, wc.Status, "WR %d", i)
	}
	require.Equal(t, n-started, l.a.q.SendQueueLen())

	require.NoError(t, l.a.q.Modify(&Attr{State: RTS}, AttrState, l.now))
	l.a.q.Run(l.a.env, l.now, 1000)
	for iter := 0; l.a.q.SendQueueLen() > 0; iter++ {
		require.Less(t, iter, 2000, "no progress after RTS")
		if !exchange(nil, false) {
			d := l.a.q.Deadline()
			require.False(t, d.IsZero(), "stuck with no timer armed")
			l.now = d
			l.a.q.OnTimer(l.a.env, l.now, 1000)
		}
	}
	require.Equal(t, RTS, l.a.q.State())
	wcs = poll(t, l.a.scq)
	require.Len(t, wcs, n-started)
	for i, wc := range wcs {
		require.Equal(t, uint64(started+i), wc.ID)
		require.Equal(t, WCSuccess, wc.Status)
	}
	require.Equal(t, 1, w.events)

	for i, wr := range wrs {
		size := int(wr.SGL[0].Length)
		local := l.a.buf[i*slot : i*slot+size]
		remote := l.b.buf[remoteBase+i*slot : remoteBase+i*slot+size]
		switch wr.Opcode {
		case WRRDMAWrite:
			require.True(t, bytes.Equal(local, remote), "WRITE %d", i)
		case WRRDMARead:
			require.True(t, bytes.Equal(local, remote), "READ %d", i)
		}
	}
	rwcs := poll(t, l.b.rcq)
	require.Len(t, rwcs, len(sends))
	for j, wc := range rwcs {
		require.Equal(t, WCSuccess, wc.Status)
		require.Equal(t, uint32(sends[j]), wc.ByteLen)
	}
}

// requestLastPSN is the last PSN a request packet stands for: a READ
// request covers its whole response range.
func requestLastPSN(t *testing.T, raw []byte) PSN {
	var p wire.Packet
	require.NoError(t, p.Parse(raw))
	psn := PSN(p.BTH.PSN())
	if p.Opcode == wire.RCReadRequest {
		return psn.Add(uint32(pktCount(int(p.RETH.DMALen()), 256) - 1))
	}
	return psn
}
