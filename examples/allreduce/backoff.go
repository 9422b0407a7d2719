package allreduce

import (
	"context"
	"math/rand/v2"
	"time"
)

// Joining the ring: a rank dials its next rank until that one listens, up
// to the join's deadline (Timeout). The wait between two attempts grows
// from joinRetryBase, doubling, to joinRetryMax: a next rank that comes
// up at once (the ranks of one process, started together) is joined
// within a few tens of milliseconds, and one that starts seconds late (a
// process spawned over ssh, an engine still coming up) costs at most two
// attempts a second instead of twenty. Bug (workload audit): a fixed
// 50 ms sleep, twenty attempts a second for the whole Timeout, each an
// rdma_cm REQ (and its REJ) or a refused TCP connect.
const (
	joinRetryBase = 10 * time.Millisecond
	joinRetryMax  = 500 * time.Millisecond
)

// joinBackoff is the schedule of waits between join attempts: attempt
// n's ceiling is min(joinRetryBase<<n, joinRetryMax), and the wait is
// drawn from [ceiling/2, ceiling) ("equal jitter"), so the waits still
// grow while ranks that started together (their dials refused together)
// drift apart. Seeded: a rank's schedule is reproducible.
type joinBackoff struct {
	rng     *rand.Rand
	ceiling time.Duration
}

func newJoinBackoff(seed uint64) *joinBackoff {
	return &joinBackoff{rng: rand.New(rand.NewPCG(seed, 0x616c6c726564)), ceiling: joinRetryBase}
}

// next is the wait before the next attempt.
func (b *joinBackoff) next() time.Duration {
	c := b.ceiling
	b.ceiling = min(2*c, joinRetryMax)
	half := c / 2
	return half + time.Duration(b.rng.Int64N(int64(c-half)))
}

// joinRetry waits between join attempts: the schedule, and the clock that
// times it (Config.joinAfter, time.After unless a test drives it).
type joinRetry struct {
	b     *joinBackoff
	after func(time.Duration) <-chan time.Time
}

// joinRetry is cfg's: seeded with Config.joinSeed, or with the rank so
// that the ranks of one ring draw different waits.
func (c Config) joinRetry() joinRetry {
	seed := c.joinSeed
	if seed == 0 {
		seed = uint64(c.Rank) + 1
	}
	after := c.joinAfter
	if after == nil {
		after = time.After
	}
	return joinRetry{b: newJoinBackoff(seed), after: after}
}

// wait returns after the next wait of the schedule, or once ctx (the
// join's deadline) has ended.
func (r joinRetry) wait(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-r.after(r.b.next()):
	}
}
