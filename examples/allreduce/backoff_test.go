package allreduce

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/roce/transport"
)

// The waits between join attempts double from joinRetryBase up to
// joinRetryMax, each drawn from the upper half of its ceiling; a seed
// gives the same schedule every time, and two seeds (two ranks) different
// ones. Bug (workload audit): a fixed 50 ms sleep between attempts.
func TestJoinBackoffSchedule(t *testing.T) {
	const waits = 12
	draw := func(seed uint64) []time.Duration {
		b := newJoinBackoff(seed)
		ds := make([]time.Duration, waits)
		for i := range ds {
			ds[i] = b.next()
		}
		return ds
	}
	for seed := uint64(1); seed <= 8; seed++ {
		ds := draw(seed)
		for i, d := range ds {
			ceiling := min(joinRetryBase<<i, joinRetryMax)
			require.GreaterOrEqual(t, d, ceiling/2, "seed %d, wait %d", seed, i)
			require.Less(t, d, ceiling, "seed %d, wait %d", seed, i)
		}
		require.GreaterOrEqual(t, ds[waits-1], joinRetryMax/2, "the waits reach the cap")
		require.Equal(t, ds, draw(seed), "seed %d draws the same schedule again", seed)
	}
	require.NotEqual(t, draw(1), draw(2), "two ranks' schedules differ")
	// A rank's default seed is its rank: ranks 0 and 1 differ.
	r0, r1 := Config{Rank: 0}.joinRetry(), Config{Rank: 1}.joinRetry()
	require.NotEqual(t, r0.b.next()+r0.b.next()+r0.b.next(), r1.b.next()+r1.b.next()+r1.b.next())
}

// fakeAfter is a join's clock that a test drives: each wait the join asks
// for is handed to the test (asked), and ends when the test fires it.
type fakeAfter struct{ asked chan fakeTimer }

type fakeTimer struct {
	d    time.Duration
	fire chan time.Time
}

func newFakeAfter() *fakeAfter {
	// Room for every wait a join could ask for: a join the test gave up
	// on never blocks on its clock.
	return &fakeAfter{asked: make(chan fakeTimer, 1024)}
}

func (f *fakeAfter) after(d time.Duration) <-chan time.Time {
	ft := fakeTimer{d, make(chan time.Time, 1)}
	f.asked <- ft
	return ft.fire
}

// A rank whose next rank is not listening yet waits between attempts as
// the schedule says (asked of its clock, none slept here), and joins the
// ring once that rank starts, however late: over TCP (connection
// refused) and over RDMA (REJ: no listener). Bug (workload audit): the
// join retried every 50 ms whatever had happened, on the wall clock.
func TestRankThatListensLateIsJoined(t *testing.T) {
	const timeout = time.Minute
	const seed, early = 7, 6 // waits before rank 1 starts
	for _, tr := range []string{"tcp", "rdma"} {
		t.Run(tr, func(t *testing.T) {
			clock := newFakeAfter()
			cfgOf := func(i int) Config {
				cfg := Config{Rank: i, Ranks: 2, Count: 64, Timeout: timeout}
				if i == 0 {
					cfg.joinAfter, cfg.joinSeed = clock.after, seed
				}
				return cfg
			}
			var dial func(context.Context, int) (Member, error)
			if tr == "tcp" {
				base := freePortBase(t, 2)
				addr := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", base+i%2) }
				dial = func(ctx context.Context, i int) (Member, error) {
					r, err := DialTCP(ctx, cfgOf(i), TCPConfig{Listen: addr(i), Next: addr(i + 1)})
					if err != nil {
						return nil, err
					}
					return r, nil
				}
			} else {
				dial = rdmaDialerWith(t, transport.NewMemNetwork(), nil, 2, cfgOf)
			}
			type joined struct {
				m   Member
				err error
			}
			start := func(i int) <-chan joined {
				ch := make(chan joined, 1)
				go func() {
					m, err := dial(context.Background(), i)
					ch <- joined{m, err}
				}()
				return ch
			}
			want := newJoinBackoff(seed)
			nextWait := func() fakeTimer {
				t.Helper()
				select {
				case ft := <-clock.asked:
					require.Equal(t, want.next(), ft.d, "the join's wait follows its schedule")
					return ft
				case <-time.After(timeout / 2):
					t.Fatal("rank 0 did not ask its clock for a wait between join attempts")
					return fakeTimer{}
				}
			}
			j0 := start(0)
			for range early {
				nextWait().fire <- time.Time{}
			}
			// Rank 0 waits out its next wait now; rank 1 starts.
			ft := nextWait()
			j1 := start(1)
			ft.fire <- time.Time{}
			var r0 joined
			for waiting := true; waiting; {
				select {
				case r0 = <-j0:
					waiting = false
				case ft := <-clock.asked: // rank 1 not listening yet: again
					require.Equal(t, want.next(), ft.d, "the join's wait follows its schedule")
					ft.fire <- time.Time{}
				}
			}
			r1 := <-j1
			require.NoError(t, r0.err)
			require.NoError(t, r1.err)
			ms := []Member{r0.m, r1.m}
			defer closeAll(ms)
			requireAllReduce(t, context.Background(), ms)
		})
	}
}
