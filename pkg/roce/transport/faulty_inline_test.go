package transport

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// inlineModel replays the receive direction's draws for loss and
// corruption alone: which of n datagrams arrive, which are corrupted.
func inlineModel(cfg FaultConfig, n int) (kept []int, corrupted map[int]bool) {
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x72656376)) // "recv"
	corrupted = map[int]bool{}
	for i := range n {
		rL, rC, _, _ := rng.Float64(), rng.Float64(), rng.Float64(), rng.Float64()
		rng.Uint64()
		if rL < cfg.Loss {
			continue
		}
		if rC < cfg.Corrupt {
			corrupted[i] = true
		}
		kept = append(kept, i)
	}
	return kept, corrupted
}

// Loss and corruption on receive are decided as each datagram is
// received, with no pump goroutine or queue, and pick the datagrams the
// seed's draws pick: the survivors in order, each corrupted one with
// exactly one bit flipped. Receive batches of 7 make the survivors move
// down over lost ones inside a batch.
func TestFaultyInlineReceiveFollowsTheDraws(t *testing.T) {
	mn := NewMemNetwork()
	a, err := mn.Listen(ap("10.0.0.1:1"))
	require.NoError(t, err)
	b, err := mn.Listen(ap("10.0.0.2:1"))
	require.NoError(t, err)
	cfg := FaultConfig{Direction: DirReceive, Loss: 0.3, Corrupt: 0.2, Seed: 11}
	f := NewFaulty(b, cfg)
	defer f.Close()
	defer a.Close()
	require.Nil(t, f.rxq, "inline: no queue")
	require.Nil(t, f.pumpDone, "inline: no pump")

	const n = 400
	var bufs [][]byte
	for i := range n {
		bufs = append(bufs, idPayload(i, 32))
	}
	require.NoError(t, a.Send(bufs, Endpoint{Remote: ap("10.0.0.2:1")}))
	kept, corrupted := inlineModel(cfg, n)
	got := receiveNBatch(t, f, len(kept), 64, 7)
	for j, g := range got {
		want := idPayload(kept[j], 32)
		diff := 0
		for i := range want {
			diff += bits.OnesCount8(want[i] ^ g.data[i])
		}
		if corrupted[kept[j]] {
			require.Equal(t, 1, diff, "datagram %d: one bit flipped", kept[j])
		} else {
			require.Equal(t, want, g.data, "datagram %d", kept[j])
		}
		require.Equal(t, Endpoint{Local: ap("10.0.0.2:1"), Remote: ap("10.0.0.1:1")}, g.ep)
	}
	_, r := f.FaultStats()
	require.Equal(t, FaultCounts{Seen: n, Lost: uint64(n - len(kept)), Corrupted: uint64(len(corrupted))}, r)
}

// fakeLender lends batches it was given, from its own memory, and counts
// the releases; it can be polled.
type fakeLender struct {
	Conn
	mu      sync.Mutex
	batches [][][]byte
	from    Endpoint
	lease   Lease
	covered int
}

func (l *fakeLender) recycle() {}

func (l *fakeLender) ReceiveLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (int, error) {
	return l.PollLent(pkts, eps, leases)
}

func (l *fakeLender) PollLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.batches) == 0 {
		return 0, errClosed
	}
	b := l.batches[0]
	l.batches = l.batches[1:]
	for i, p := range b {
		pkts[i], eps[i], leases[i] = p, l.from, &l.lease
	}
	l.lease.refs.Add(int32(len(b)))
	return len(b), nil
}

func (l *fakeLender) ReceiveLentLocked(pkts [][]byte, eps []Endpoint, leases []*Lease, mu sync.Locker) (int, error) {
	n, err := l.PollLent(pkts, eps, leases)
	if err == nil {
		mu.Lock()
	}
	return n, err
}

func (l *fakeLender) Cover()        { l.covered++ }
func (l *fakeLender) Uncover()      { l.covered-- }
func (l *fakeLender) CanPoll() bool { return true }

func newFakeLender(t *testing.T, batches ...[][]byte) *fakeLender {
	mn := NewMemNetwork()
	c, err := mn.Listen(ap("10.0.0.3:1"))
	require.NoError(t, err)
	l := &fakeLender{Conn: c, batches: batches, from: Endpoint{Remote: ap("10.0.0.9:1")}}
	l.lease.home = l
	l.lease.open()
	return l
}

func numbered(from, n int) [][]byte {
	var b [][]byte
	for i := from; i < from+n; i++ {
		b = append(b, idPayload(i, 16))
	}
	return b
}

func ids(pkts [][]byte) []int {
	var out []int
	for _, p := range pkts {
		out = append(out, int(binary.BigEndian.Uint32(p)))
	}
	return out
}

// With inline faults a Faulty lends the inner Conn's own memory (no copy)
// and releases each lost datagram's lease at once; the engine polls it as
// it polls the inner Conn. A batch that was all lost does not end a wait:
// ReceiveLentLocked lets go of the caller's lock and waits again.
func TestFaultyInlineLendsAndPollsTheInnerConn(t *testing.T) {
	cfg := FaultConfig{Direction: DirReceive, Loss: 0.5}
	var kept []int
	for cfg.Seed = 1; len(kept) == 0 || kept[0] == 0; cfg.Seed++ {
		kept, _ = inlineModel(cfg, 48) // a seed that loses the first datagram
	}
	cfg.Seed--
	first := kept[0]
	// Batch 1 holds only datagrams the draws lose, so ReceiveLentLocked
	// must wait for batch 2.
	inner := newFakeLender(t, numbered(0, first), numbered(first, 16), numbered(first+16, 48-first-16))
	f := NewFaulty(inner, cfg)
	defer f.Close()
	require.Equal(t, Lender(f), Lend(f))
	var p Poller = f
	require.True(t, p.CanPoll())
	p.Cover()
	require.Equal(t, 1, inner.covered)
	p.Uncover()

	pkts, eps, leases := make([][]byte, 64), make([]Endpoint, 64), make([]*Lease, 64)
	var mu sync.Mutex
	n, err := p.ReceiveLentLocked(pkts, eps, leases, &mu)
	require.NoError(t, err)
	require.False(t, mu.TryLock(), "returned with the lock held")
	mu.Unlock()
	var got []int
	got = append(got, ids(pkts[:n])...)
	require.Same(t, &inner.lease, leases[0], "the inner Conn's memory, lent")
	n, err = p.PollLent(pkts, eps, leases)
	require.NoError(t, err)
	got = append(got, ids(pkts[:n])...)
	require.Equal(t, kept, got)
	require.Nil(t, pkts[n], "no stale view past the survivors")
	// Every lost datagram's reference is gone; the survivors' remain.
	require.Equal(t, int32(1+len(kept)), inner.lease.refs.Load())
	_, r := f.FaultStats()
	require.Equal(t, uint64(48), r.Seen)
	require.Equal(t, uint64(48-len(kept)), r.Lost)
}

// Faults that hold datagrams back or add some keep the pump and its
// queue: the Faulty lends copies (polled only when the inner Conn can be:
// TestFaultyQueuedFaultsCanBePolled), and with no receive faults it
// lends what the inner Conn lends.
func TestFaultyLendsCopiesWhenFaultsQueue(t *testing.T) {
	inner := newFakeLender(t)
	f := NewFaulty(inner, FaultConfig{Direction: DirReceive, Dup: 1, Seed: 1})
	require.NotNil(t, f.rxq)
	q, queued := f.lender.(*queuedRx)
	require.True(t, queued)
	require.NotNil(t, q.wait, "copies of the queue's datagrams")
	f.Close()

	mn := NewMemNetwork()
	a, err := mn.Listen(ap("10.0.0.1:1"))
	require.NoError(t, err)
	b, err := mn.Listen(ap("10.0.0.2:1"))
	require.NoError(t, err)
	g := NewFaulty(b, FaultConfig{Direction: DirReceive, Dup: 1, Seed: 1})
	defer g.Close()
	defer a.Close()
	require.False(t, g.CanPoll(), "an in-memory Conn cannot be polled, nor its Faulty")
	require.NoError(t, a.Send(numbered(0, 3), Endpoint{Remote: ap("10.0.0.2:1")}))
	pkts, eps, leases := make([][]byte, 8), make([]Endpoint, 8), make([]*Lease, 8)
	var got []int
	for len(got) < 6 {
		n, err := g.ReceiveLent(pkts, eps, leases)
		require.NoError(t, err)
		got = append(got, ids(pkts[:n])...)
		for _, l := range leases[:n] {
			l.Release()
		}
	}
	require.Equal(t, []int{0, 0, 1, 1, 2, 2}, got, "each one twice")

	h := NewFaulty(newFakeLender(t), FaultConfig{Direction: DirSend, Loss: 0.5})
	defer h.Close()
	require.True(t, h.CanPoll(), "receives untouched: polled through")
	_, copies := h.lender.(*copyLender)
	require.False(t, copies)
}

// gatherCounter counts the datagrams sent, allocating nothing.
type gatherCounter struct {
	Conn
	n int
}

func (g *gatherCounter) Send(bufs [][]byte, ep Endpoint) error { g.n += len(bufs); return nil }
func (g *gatherCounter) SendGather(d []Gather, ep Endpoint) error {
	g.n += len(d)
	return nil
}

// The inline paths allocate nothing per datagram: a lent batch filtered,
// a gather sent in pieces (a corrupted one copied into reused memory).
func TestFaultyInlineSteadyStateAllocs(t *testing.T) {
	batch := [1][][]byte{numbered(0, 32)}
	inner := newFakeLender(t)
	f := NewFaulty(inner, FaultConfig{Loss: 0.2, Corrupt: 0.05, Seed: 4})
	defer f.Close()
	out := &gatherCounter{Conn: inner}
	g := NewFaulty(out, FaultConfig{Direction: DirSend, Loss: 0.2, Corrupt: 0.05, Seed: 4})
	defer g.Close()
	dgrams := make([]Gather, 32)
	for i := range dgrams {
		dgrams[i] = pieces(i)
	}
	pkts, eps, leases := make([][]byte, 32), make([]Endpoint, 32), make([]*Lease, 32)
	received := 0
	round := func() {
		inner.batches = batch[:]
		n, err := f.ReceiveLent(pkts, eps, leases)
		if err != nil {
			t.Fatal(err)
		}
		received += n
		for _, l := range leases[:n] {
			l.Release()
		}
		if err := g.SendGather(dgrams, Endpoint{}); err != nil {
			t.Fatal(err)
		}
	}
	for range 50 {
		round()
	}
	require.Zero(t, testing.AllocsPerRun(100, round))
	require.Positive(t, received)
	require.Positive(t, out.n)
	_, r := f.FaultStats()
	s, _ := g.FaultStats()
	require.Positive(t, r.Corrupted+s.Corrupted, "the corrupted copies were exercised")
}
