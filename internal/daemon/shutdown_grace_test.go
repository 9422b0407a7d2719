package daemon

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeTicks is a Config.Ticker (and Config.Now) on a clock of the
// test's: time moves only with advance, and each ticker ticks as the
// clock reaches its next tick. Every ticker made is announced on made
// (its period), so that the test knows a wait has started.
type fakeTicks struct {
	mu      sync.Mutex
	now     time.Time
	tickers []*fakeTicker
	made    chan time.Duration
}

type fakeTicker struct {
	every   time.Duration
	next    time.Time
	c       chan time.Time
	stopped bool
}

func newFakeTicks() *fakeTicks {
	return &fakeTicks{now: time.Unix(1_800_000_000, 0), made: make(chan time.Duration, 16)}
}

func (f *fakeTicks) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeTicks) ticker(every time.Duration) (<-chan time.Time, func()) {
	f.mu.Lock()
	t := &fakeTicker{every: every, next: f.now.Add(every), c: make(chan time.Time, 1)}
	f.tickers = append(f.tickers, t)
	f.mu.Unlock()
	f.made <- every
	return t.c, func() {
		f.mu.Lock()
		t.stopped = true
		f.mu.Unlock()
	}
}

// advance moves the clock by d and ticks the tickers it takes past a
// tick (a tick the reader has not taken is dropped, as time.Ticker's).
func (f *fakeTicks) advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	for _, t := range f.tickers {
		for !t.stopped && !t.next.After(f.now) {
			select {
			case t.c <- t.next:
			default:
			}
			t.next = t.next.Add(t.every)
		}
	}
}

// TestShutdownGraceRunsOnTheInjectedClock: a session still running when
// Run's context ends keeps its context for ShutdownGrace on the daemon's
// clock (Config.Ticker, Config.Now), not the wall clock: a nanosecond
// short of the grace it still runs, and its context ends exactly as the
// clock reaches the grace, after which Run returns. Bug (daemon
// timing task, item 2): shutdown waited on a time.Timer whatever the Config, so
// no test could drive the grace, only sit it out.
func TestShutdownGraceRunsOnTheInjectedClock(t *testing.T) {
	const grace = 30 * time.Second
	clock := newFakeTicks()
	d, err := New(Config{Addrs: addrs(t, "127.0.3.161"), IdleTimeout: -1, ShutdownGrace: grace,
		Ticker: clock.ticker, Now: clock.Now, Exports: []ExportSpec{{Name: "data", Kind: ExportAnon, Size: 1 << 16}}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()

	// A session as the accept loops admit one, that runs until its
	// context ends and reads the clock then.
	s := &session{peer: netip.MustParseAddr("127.0.0.1"), exchange: exchangeTCP, traffic: &sessionTraffic{}}
	require.True(t, d.reg.admit(s))
	running, ended := make(chan struct{}), make(chan time.Time, 1)
	d.runSession(s, "test session", "127.0.0.1", func(ctx context.Context) error {
		close(running)
		<-ctx.Done()
		ended <- clock.Now()
		return ctx.Err()
	})
	<-running
	start := clock.Now()
	cancel() // SIGTERM

	select {
	case every := <-clock.made:
		require.Equal(t, grace, every, "the grace's ticker")
	case <-time.After(10 * time.Second): // the test's failure, not a synchronisation
		t.Fatal("shutdown did not time its grace on Config.Ticker")
	}
	clock.advance(grace - time.Nanosecond)
	select {
	case at := <-ended:
		t.Fatalf("the session's context ended %v into a grace of %v", at.Sub(start), grace)
	case err := <-runErr:
		t.Fatalf("Run returned (%v) before the grace was over", err)
	default:
	}
	clock.advance(time.Nanosecond)
	select {
	case at := <-ended:
		require.Equal(t, grace, at.Sub(start), "the session's context ended off the grace")
	case <-time.After(10 * time.Second):
		t.Fatal("the session's context did not end with the grace")
	}
	require.NoError(t, <-runErr)
	require.Equal(t, uint64(1), d.failed.Load(), "the session aborted at the grace counts as failed")
}
