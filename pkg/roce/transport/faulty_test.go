package transport

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// faultPair is a sender wrapped in a Faulty conn and a plain receiver on a
// MemNetwork, with a manual clock.
type faultPair struct {
	f    *Faulty
	rx   Conn
	clk  *ManualClock
	dst  Endpoint
	recv *rxSet
}

func newFaultPair(t *testing.T, cfg FaultConfig) *faultPair {
	return newFaultPairQ(t, cfg, 1<<16)
}

func newFaultPairQ(t *testing.T, cfg FaultConfig, qlen int) *faultPair {
	t.Helper()
	mn := NewMemNetwork()
	mn.QueueLen = qlen
	a, err := mn.Listen(ap("10.0.0.1:4791"))
	require.NoError(t, err)
	b, err := mn.Listen(ap("10.0.0.2:4791"))
	require.NoError(t, err)
	clk := NewManualClock(time.Unix(1000, 0))
	cfg.Clock = clk
	f := NewFaulty(a, cfg)
	t.Cleanup(func() { f.Close(); b.Close() })
	return &faultPair{f: f, rx: b, clk: clk, dst: Endpoint{Remote: ap("10.0.0.2:4791")}, recv: newRxSet(256, 2048)}
}

// idPayload is a datagram carrying its index, padded to size.
func idPayload(id, size int) []byte {
	b := make([]byte, size)
	binary.BigEndian.PutUint32(b, uint32(id))
	for i := 4; i < size; i++ {
		b[i] = byte(id + i)
	}
	return b
}

// drain returns everything queued at the receiver without blocking (the
// MemNetwork delivers synchronously).
func (p *faultPair) drain(t *testing.T) [][]byte {
	t.Helper()
	var out [][]byte
	for p.rx.(*memConn).q.count > 0 {
		n, err := p.rx.Receive(p.recv.bufs, p.recv.sizes, p.recv.eps)
		require.NoError(t, err)
		for i := range n {
			out = append(out, bytes.Clone(p.recv.bufs[i][:p.recv.sizes[i]]))
		}
	}
	return out
}

func (p *faultPair) sendAll(t *testing.T, n, size, batch int) [][]byte {
	t.Helper()
	var sent [][]byte
	for i := 0; i < n; i += batch {
		var bufs [][]byte
		for j := i; j < min(n, i+batch); j++ {
			bufs = append(bufs, idPayload(j, size))
		}
		sent = append(sent, bufs...)
		require.NoError(t, p.f.Send(bufs, p.dst))
	}
	return sent
}

// faultModel replays the injector's documented decision rules for the send
// direction without delay, from the same generator, giving the expected
// delivery order (by id) and counts.
func faultModel(cfg FaultConfig, n int) (order []int, corrupted map[int]bool, c FaultCounts) {
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x73656e64))
	depth := max(cfg.ReorderDepth, 1)
	type held struct{ id, after int }
	var hs []held
	corrupted = map[int]bool{}
	emit := func(id int) {
		order = append(order, id)
		var keep []held
		var rel []int
		for _, h := range hs {
			h.after--
			if h.after > 0 {
				keep = append(keep, h)
			} else {
				rel = append(rel, h.id)
			}
		}
		hs = keep
		order = append(order, rel...)
	}
	for i := range n {
		rL, rC, rD, rR := rng.Float64(), rng.Float64(), rng.Float64(), rng.Float64()
		rng.Uint64()
		c.Seen++
		if rL < cfg.Loss {
			c.Lost++
			continue
		}
		if rC < cfg.Corrupt {
			c.Corrupted++
			corrupted[i] = true
		}
		if rR < cfg.Reorder {
			c.Reordered++
			hs = append(hs, held{i, depth})
		} else {
			emit(i)
		}
		if rD < cfg.Dup {
			c.Duplicated++
			emit(i)
		}
	}
	for _, h := range hs { // released by ReorderHold, in hold order
		order = append(order, h.id)
	}
	return order, corrupted, c
}

func TestFaultyMatchesModel(t *testing.T) {
	for _, cfg := range []FaultConfig{
		{Loss: 0.1, Dup: 0.05, Reorder: 0.05, Corrupt: 0.01, Seed: 7},
		{Loss: 0.3, Seed: 1},
		{Reorder: 0.5, ReorderDepth: 3, Seed: 99},
		{Dup: 1, Seed: 3},
		{Corrupt: 1, Seed: 4},
		{Reorder: 1, Seed: 5}, // everything held until ReorderHold
	} {
		t.Run(cfg.String(), func(t *testing.T) {
			const n = 5000
			p := newFaultPair(t, cfg)
			sent := p.sendAll(t, n, 64, 37)
			got := p.drain(t)
			p.clk.Advance(DefaultReorderHold)
			got = append(got, p.drain(t)...)
			require.Zero(t, p.clk.Pending())

			order, corrupted, want := faultModel(cfg, n)
			send, recv := p.f.FaultStats()
			require.Equal(t, want, send)
			require.Equal(t, FaultCounts{}, recv)
			require.Len(t, got, len(order))
			for k, id := range order {
				d := got[k]
				if corrupted[id] {
					require.Len(t, d, 64)
					diff := 0
					for i := range d {
						diff += bits.OnesCount8(d[i] ^ sent[id][i])
					}
					require.Equal(t, 1, diff, "datagram %d (id %d) must differ in exactly one bit", k, id)
				} else {
					require.Equal(t, sent[id], d, "datagram %d should be id %d", k, id)
				}
			}
			// The caller's buffers were never touched.
			for i := range sent {
				require.Equal(t, idPayload(i, 64), sent[i])
			}
		})
	}
}

// TestFaultyStatisticalSanity: with the fault mix and a fixed seed,
// the injected counts are near their expectations (a wrong draw order or a
// swapped probability would show).
func TestFaultyStatisticalSanity(t *testing.T) {
	p := newFaultPair(t, FaultConfig{Loss: 0.1, Dup: 0.05, Reorder: 0.05, Corrupt: 0.01, Seed: 7})
	const n = 20000
	p.sendAll(t, n, 32, 64)
	s, _ := p.f.FaultStats()
	near := func(got uint64, prob float64, base uint64) {
		exp := prob * float64(base)
		tol := 5*sqrt(exp) + 1
		require.InDelta(t, exp, float64(got), tol, "count %d for p=%v of %d", got, prob, base)
	}
	require.Equal(t, uint64(n), s.Seen)
	near(s.Lost, 0.1, n)
	kept := n - s.Lost
	near(s.Dup(), 0.05, kept)
	near(s.Reordered, 0.05, kept)
	near(s.Corrupted, 0.01, kept)
}

func (c FaultCounts) Dup() uint64 { return c.Duplicated }

func sqrt(x float64) float64 {
	z := x
	for range 50 {
		if z == 0 {
			return 0
		}
		z = (z + x/z) / 2
	}
	return z
}

func TestFaultySameSeedSameRun(t *testing.T) {
	run := func(seed int64) [][]byte {
		p := newFaultPair(t, FaultConfig{Loss: 0.1, Dup: 0.05, Reorder: 0.05, Corrupt: 0.05, Jitter: 3 * time.Millisecond, Seed: seed})
		p.sendAll(t, 3000, 100, 16)
		p.clk.Advance(time.Second)
		return p.drain(t)
	}
	a, b, c := run(42), run(42), run(43)
	require.Equal(t, a, b)
	require.NotEqual(t, a, c)
}

func TestFaultyDelay(t *testing.T) {
	p := newFaultPair(t, FaultConfig{Delay: 5 * time.Millisecond, Seed: 1})
	inner := p.f.inner.(StatsReporter)
	require.NoError(t, p.f.Send([][]byte{idPayload(0, 8), idPayload(1, 8)}, p.dst))
	p.clk.Advance(2 * time.Millisecond)
	require.NoError(t, p.f.Send([][]byte{idPayload(2, 8)}, p.dst))
	require.Zero(t, inner.Stats().SentPackets)
	p.clk.Advance(3 * time.Millisecond) // first two due
	require.Equal(t, uint64(2), inner.Stats().SentPackets)
	p.clk.Advance(2*time.Millisecond - 1)
	require.Equal(t, uint64(2), inner.Stats().SentPackets)
	p.clk.Advance(1)
	got := p.drain(t)
	require.Equal(t, [][]byte{idPayload(0, 8), idPayload(1, 8), idPayload(2, 8)}, got)
	s, _ := p.f.FaultStats()
	require.Equal(t, uint64(3), s.Delayed)
	require.Zero(t, p.clk.Pending())
}

func TestFaultyJitterOrdersByDueTime(t *testing.T) {
	cfg := FaultConfig{Delay: time.Millisecond, Jitter: 10 * time.Millisecond, Seed: 11}
	p := newFaultPair(t, cfg)
	const n = 200
	p.sendAll(t, n, 16, 10)
	p.clk.Advance(11 * time.Millisecond)
	got := p.drain(t)
	require.Len(t, got, n)
	// Replay the delays: arrival order is by delay, ties in send order.
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x73656e64))
	delays := make([]time.Duration, n)
	for i := range n {
		rng.Float64()
		rng.Float64()
		rng.Float64()
		rng.Float64()
		rng.Uint64()
		delays[i] = cfg.Delay + time.Duration(rng.Int64N(int64(cfg.Jitter)))
	}
	prev := time.Duration(-1)
	reordered := false
	for k, d := range got {
		id := int(binary.BigEndian.Uint32(d))
		require.GreaterOrEqual(t, delays[id], prev, "arrival %d", k)
		prev = delays[id]
		reordered = reordered || id != k
	}
	require.True(t, reordered)
}

func TestFaultyDelayFunc(t *testing.T) {
	cfg := FaultConfig{DelayFunc: func(r *rand.Rand) time.Duration {
		return time.Duration(r.ExpFloat64() * float64(time.Millisecond))
	}, Seed: 2}
	p := newFaultPair(t, cfg)
	p.sendAll(t, 100, 16, 10)
	require.Len(t, p.drain(t), 0)
	p.clk.Advance(time.Hour)
	require.Len(t, p.drain(t), 100)
}

func TestFaultyReceiveDirection(t *testing.T) {
	mn := NewMemNetwork()
	a, _ := mn.Listen(ap("10.0.0.1:1"))
	b, _ := mn.Listen(ap("10.0.0.2:1"))
	clk := NewManualClock(time.Unix(0, 0))
	f := NewFaulty(b, FaultConfig{Direction: DirReceive, Loss: 0.5, Delay: time.Millisecond, Seed: 9, Clock: clk})
	defer f.Close()
	defer a.Close()
	// Send-side traffic of the wrapped conn is untouched.
	require.NoError(t, f.Send([][]byte{{1}}, Endpoint{Remote: ap("10.0.0.1:1")}))
	got := receiveN(t, a, 1, 16)
	require.Equal(t, []byte{1}, got[0].data)

	const n = 400
	var bufs [][]byte
	for i := range n {
		bufs = append(bufs, idPayload(i, 20))
	}
	require.NoError(t, a.Send(bufs, Endpoint{Remote: ap("10.0.0.2:1")}))
	// The pump sees all of them; survivors wait for the clock.
	require.Eventually(t, func() bool { _, r := f.FaultStats(); return r.Seen == n }, 10*time.Second, time.Millisecond)
	_, r := f.FaultStats()
	require.InDelta(t, n/2, float64(r.Lost), 5*sqrt(n/4))
	require.Equal(t, n-r.Lost, r.Delayed)
	require.Zero(t, f.rxq.count)
	clk.Advance(time.Millisecond)
	out := receiveN(t, f, int(n-r.Lost), 64)
	last := -1
	for _, g := range out {
		id := int(binary.BigEndian.Uint32(g.data))
		require.Greater(t, id, last)
		last = id
		require.Equal(t, Endpoint{Local: ap("10.0.0.2:1"), Remote: ap("10.0.0.1:1")}, g.ep)
	}
	s, _ := f.FaultStats()
	require.Equal(t, uint64(0), s.Seen)
}

func TestFaultyCloseUnblocksReceive(t *testing.T) {
	for _, dir := range []Direction{DirBoth, DirSend, DirReceive} {
		t.Run(dir.String(), func(t *testing.T) {
			mn := NewMemNetwork()
			a, _ := mn.Listen(ap("10.0.0.1:1"))
			f := NewFaulty(a, FaultConfig{Direction: dir, Delay: time.Second, Clock: NewManualClock(time.Unix(0, 0))})
			testCloseUnblocks(t, f)
			require.ErrorIs(t, f.Send([][]byte{{1}}, Endpoint{Remote: ap("10.0.0.1:1")}), net.ErrClosed)
		})
	}
}

func TestFaultyCloseDropsPending(t *testing.T) {
	p := newFaultPair(t, FaultConfig{Delay: time.Millisecond, Reorder: 0.5, Seed: 1})
	p.sendAll(t, 50, 8, 50)
	require.Equal(t, 1, p.clk.Pending())
	require.NoError(t, p.f.Close())
	require.Zero(t, p.clk.Pending())
	p.clk.Advance(time.Hour)
	require.Empty(t, p.drain(t))
}

func TestFaultyRealClock(t *testing.T) {
	mn := NewMemNetwork()
	a, _ := mn.Listen(ap("10.0.0.1:1"))
	b, _ := mn.Listen(ap("10.0.0.2:1"))
	defer b.Close()
	f := NewFaulty(a, FaultConfig{Delay: time.Microsecond, Reorder: 1, ReorderHold: time.Microsecond})
	defer f.Close()
	require.NoError(t, f.Send([][]byte{{1}, {2}}, Endpoint{Remote: ap("10.0.0.2:1")}))
	got := receiveN(t, b, 2, 8) // released by real timers
	require.ElementsMatch(t, [][]byte{{1}, {2}}, [][]byte{got[0].data, got[1].data})
}

func TestNewFaultyPanicsOnBadConfig(t *testing.T) {
	mn := NewMemNetwork()
	a, _ := mn.Listen(ap("10.0.0.1:1"))
	defer a.Close()
	require.Panics(t, func() { NewFaulty(a, FaultConfig{Loss: 1.5}) })
}

func TestFaultySteadyStateAllocs(t *testing.T) {
	p := newFaultPairQ(t, FaultConfig{Loss: 0.1, Dup: 0.05, Reorder: 0.05, Corrupt: 0.01, Seed: 7}, 64)
	bufs := make([][]byte, 32)
	for i := range bufs {
		bufs[i] = idPayload(i, 512)
	}
	round := func() {
		if err := p.f.Send(bufs, p.dst); err != nil {
			t.Fatal(err)
		}
		p.clk.Advance(DefaultReorderHold)
		for p.rx.(*memConn).q.count > 0 {
			if _, err := p.rx.Receive(p.recv.bufs, p.recv.sizes, p.recv.eps); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 200 {
		round()
	}
	allocs := testing.AllocsPerRun(100, round)
	t.Logf("%.2f allocs per round of %d datagrams", allocs, len(bufs))
	// Arming a timer for a held datagram allocates (the Clock's timer); the
	// datagrams themselves come from pools.
	require.Less(t, allocs/float64(len(bufs)), 0.25)
}
