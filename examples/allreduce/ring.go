package allreduce

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// Config is one rank's place in the ring.
type Config struct {
	Rank, Ranks int
	Count       int // float32 elements per vector (the same on every rank)
	// Timeout bounds connection setup and each step (a rank that died).
	Timeout time.Duration
	// Spin is how an RDMA rank waits for its completions: it spins on
	// its CQ this long before it sleeps (ib.HybridWaiter's base budget,
	// which adapts up to four times it); 0 is ib.DefaultHybridSpin.
	// Negative: it sleeps at once (CQ.WaitPoll), a thread wake-up per
	// chunk: two rank processes on 2 CPUs took 415-617 us per 4-16 KiB
	// allreduce that way, 53-59 us spinning (docs/workloads.md, which
	// also says when spinning costs more than it saves). The TCP ring
	// ignores it: its reads sleep in the netpoller.
	Spin time.Duration

	// joinAfter times the waits between attempts to join the next rank
	// (backoff.go; nil is time.After) and joinSeed seeds their jitter (0:
	// from the rank): tests drive the join without sleeping.
	joinAfter func(time.Duration) <-chan time.Time
	joinSeed  uint64
}

// MaxRanks is the most ranks a ring has: the hello carries a rank and
// the rank count in 16 bits each (hello.go), so a larger count would
// wrap and two ranks would take each other for another.
const MaxRanks = 1<<16 - 1

func (c Config) check() error {
	if c.Ranks < 2 || c.Ranks > MaxRanks {
		return fmt.Errorf("allreduce: %d ranks (2 to %d)", c.Ranks, MaxRanks)
	}
	if c.Rank < 0 || c.Rank >= c.Ranks {
		return fmt.Errorf("allreduce: rank %d of %d", c.Rank, c.Ranks)
	}
	if c.Count < c.Ranks {
		return fmt.Errorf("allreduce: %d elements for %d ranks (at least one per rank)", c.Count, c.Ranks)
	}
	if c.Timeout <= 0 {
		return errors.New("allreduce: Timeout must be positive")
	}
	return nil
}

func (c Config) next() int { return (c.Rank + 1) % c.Ranks }
func (c Config) prev() int { return (c.Rank + c.Ranks - 1) % c.Ranks }

// chunk returns the element range of chunk i.
func chunk(count, ranks, i int) (lo, hi int) {
	i = ((i % ranks) + ranks) % ranks
	return i * count / ranks, (i + 1) * count / ranks
}

// maxChunk is the largest chunk in elements.
func maxChunk(count, ranks int) int { return (count + ranks - 1) / ranks }

// link is a rank's two neighbours: send to the next, receive from the
// previous. Steps are numbered from 0 over the ring's life.
type link interface {
	// send starts sending b (chunk data) for step, after the sends
	// before it; b stays untouched until waitSent returns. last says
	// that waitSent comes before the next send (the ring's last step of a
	// phase).
	send(ctx context.Context, step uint32, b []byte, last bool) error
	// recv waits for step's chunk from the previous rank and returns it;
	// it stays valid until the next recv.
	recv(ctx context.Context, step uint32, n int) ([]byte, error)
	// waitSent returns once every send so far is complete (over RDMA:
	// acknowledged, so no retransmission reads the chunk again).
	waitSent(ctx context.Context) error
	// leave returns once both neighbours are done with this rank.
	leave(ctx context.Context) error
	// hangUp tells both neighbours at once that this rank has left,
	// waiting for no answer: a failed allreduce reports its error without
	// waiting on a neighbour that may be dead. close does the rest.
	hangUp()
	close() error
}

// ring runs the algorithm over a link.
type ring struct {
	cfg  Config
	l    link
	data []float32
	step uint32
	// done is closed when a neighbour left; err says who.
	done  <-chan struct{}
	doneE func() error
}

// allReduce sums r.data over the ring in place.
func (r *ring) allReduce(ctx context.Context) error {
	n, me := r.cfg.Ranks, r.cfg.Rank
	ctx, cancel := context.WithCancelCause(ctx)
	// The watcher turns a neighbour's leaving into the steps' cause; the
	// call returns only once it has ended (docs/DESIGN.md: goroutines end
	// with their owner).
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		defer hook(watcherExits)
		select {
		case <-r.done:
			cancel(r.doneE())
		case <-ctx.Done():
		}
	}()
	defer func() {
		cancel(nil)
		hook(watcherJoined)
		<-watched
	}()
	phase := func(name string, s int, sendChunk, recvChunk int, reduce bool) error {
		step := r.step
		r.step++
		slo, shi := chunk(r.cfg.Count, n, sendChunk)
		rlo, rhi := chunk(r.cfg.Count, n, recvChunk)
		sctx, scancel := context.WithTimeout(ctx, r.cfg.Timeout)
		defer scancel()
		if err := r.l.send(sctx, step, f32bytes(r.data[slo:shi]), s == n-2); err != nil {
			return r.stepErr(ctx, name, s, err, toNext)
		}
		hook(chunkSent)
		b, err := r.l.recv(sctx, step, (rhi-rlo)*4)
		if err != nil {
			return r.stepErr(ctx, name, s, err, toPrev)
		}
		dst := r.data[rlo:rhi]
		if reduce {
			for i := range dst {
				dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[i*4:])) + dst[i]
			}
		} else {
			for i := range dst {
				dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[i*4:]))
			}
		}
		return nil
	}
	// The sends go on while the steps do; a chunk must not change under
	// a send of it, and only all-gather's copies change chunks that were
	// sent: all-gather step s copies into chunk me-s, which reduce-
	// scatter step s sent (reduce-scatter's own reductions go into the
	// chunk the next step sends, and all-gather's copies into chunks it
	// sends later). So the reduce-scatter's sends complete before the
	// all-gather starts, and every send before the caller gets Data back.
	// Waiting for each step's send before the next step, 8 ranks in one
	// process took 1.3x as long at 4-64 KiB (docs/workloads.md).
	sent := func(name string) error {
		sctx, scancel := context.WithTimeout(ctx, r.cfg.Timeout)
		defer scancel()
		if err := r.l.waitSent(sctx); err != nil {
			return r.stepErr(ctx, name, n-2, err, toNext)
		}
		return nil
	}
	for s := range n - 1 {
		if err := phase("reduce-scatter", s, me-s, me-s-1, true); err != nil {
			return err
		}
	}
	if err := sent("reduce-scatter"); err != nil {
		return err
	}
	for s := range n - 1 {
		if err := phase("all-gather", s, me+1-s, me-s, false); err != nil {
			return err
		}
	}
	return sent("all-gather")
}

// stepErr says which step failed and why. A step's deadline means that
// the neighbour the wait was for (side) did not answer: the previous rank
// for a chunk (recv), the next rank for ours (send's wait for room in the
// send queue, waitSent: our WRITEs unacknowledged, or over TCP our writes
// not read). Bug (workload audit): every timeout blamed the previous rank,
// so a ring whose next rank stopped taking data named the wrong one.
func (r *ring) stepErr(ctx context.Context, phase string, s int, err error, side int) error {
	if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
		err = c
	} else if errors.Is(err, context.DeadlineExceeded) && side == toPrev {
		err = fmt.Errorf("no data from rank %d within %v (did it die?)", r.cfg.prev(), r.cfg.Timeout)
	} else if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("rank %d did not take this rank's data within %v (did it die?)", r.cfg.next(), r.cfg.Timeout)
	}
	return fmt.Errorf("allreduce: rank %d, %s step %d: %w", r.cfg.Rank, phase, s, err)
}

// Reference is what every rank's vector must be after an allreduce of
// inputs (one vector per rank), summed in the ring's order.
func Reference(inputs [][]float32) []float32 {
	n, count := len(inputs), len(inputs[0])
	out := make([]float32, count)
	for c := range n {
		lo, hi := chunk(count, n, c)
		for i := lo; i < hi; i++ {
			acc := inputs[c][i]
			for k := 1; k < n; k++ {
				acc = inputs[(c+k)%n][i] + acc
			}
			out[i] = acc
		}
	}
	return out
}

// Input is rank's deterministic test vector: values whose sums depend on
// the order of addition, so a wrong order shows.
func Input(rank, count int) []float32 {
	v := make([]float32, count)
	g := newInputGen(rank)
	for i := range v {
		v[i] = g.next()
	}
	return v
}

// inputGen yields Input(rank, ...)'s elements one at a time (xorshift32),
// so a rank can check its result without holding every rank's vector.
type inputGen struct{ x uint32 }

func newInputGen(rank int) inputGen { return inputGen{uint32(rank)*2654435761 + 1} }

func (g *inputGen) next() float32 {
	g.x ^= g.x << 13
	g.x ^= g.x >> 17
	g.x ^= g.x << 5
	return float32(int32(g.x%200001)-100000) / 997
}

// CheckRank counts the elements of got (one rank's vector after an
// allreduce of Input(0..ranks-1, len(got))) whose bits differ from
// Reference's, computed element by element in O(ranks) memory: each rank
// of a multi-process ring checks its own result this way.
func CheckRank(got []float32, ranks int) int {
	count := len(got)
	gens := make([]inputGen, ranks)
	for r := range gens {
		gens[r] = newInputGen(r)
	}
	vals := make([]float32, ranks)
	wrong := 0
	for c := range ranks {
		lo, hi := chunk(count, ranks, c)
		for i := lo; i < hi; i++ {
			for r := range gens {
				vals[r] = gens[r].next()
			}
			acc := vals[c]
			for k := 1; k < ranks; k++ {
				acc = vals[(c+k)%ranks] + acc
			}
			if math.Float32bits(acc) != math.Float32bits(got[i]) {
				wrong++
			}
		}
	}
	return wrong
}

// Mismatches counts elements of got whose bits differ from want.
func Mismatches(got, want []float32) int {
	n := 0
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			n++
		}
	}
	return n
}

// firstCause picks the error worth reporting from setup's two halves: a
// neighbour's refusal or mismatch over the timeout it caused elsewhere.
func firstCause(dialErr, accErr error) error {
	switch {
	case errors.Is(accErr, errMismatch) || dialErr == nil:
		return accErr
	}
	return dialErr
}
