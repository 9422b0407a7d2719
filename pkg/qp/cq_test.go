package qp

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func wcID(id uint64) WC { return WC{ID: id, Status: WCSuccess, Opcode: WCSend} }

func TestNewCQSizes(t *testing.T) {
	for _, n := range []int{0, -1, MaxCQE + 1} {
		_, err := NewCQ(n)
		require.ErrorIs(t, err, ErrCQSize, "%d", n)
	}
	for _, n := range []int{1, 16, MaxCQE} {
		cq, err := NewCQ(n)
		require.NoError(t, err)
		require.Equal(t, n, cq.Cap())
		require.Zero(t, cq.Len())
	}
}

func TestCQPushPollOrderAndWrap(t *testing.T) {
	cq, err := NewCQ(4)
	require.NoError(t, err)
	buf := make([]WC, 3)
	require.Zero(t, cq.Poll(buf))
	require.Zero(t, cq.Poll(nil))
	next, want := uint64(0), uint64(0)
	// Several laps round the ring with uneven push/poll batches.
	for lap := 0; lap < 10; lap++ {
		for k := 0; k < 3; k++ {
			require.NoError(t, cq.Push(wcID(next)))
			next++
		}
		n := cq.Poll(buf[:2])
		require.Equal(t, 2, n)
		for _, wc := range buf[:n] {
			require.Equal(t, want, wc.ID)
			want++
		}
		n = cq.Poll(buf)
		require.Equal(t, 1, n)
		require.Equal(t, want, buf[0].ID)
		want++
	}
	require.Zero(t, cq.Len())
	require.False(t, cq.Overflowed())
}

func TestCQOverflow(t *testing.T) {
	cq, err := NewCQ(3)
	require.NoError(t, err)
	for i := uint64(0); i < 3; i++ {
		require.NoError(t, cq.Push(wcID(i)))
	}
	err = cq.Push(wcID(99))
	require.ErrorIs(t, err, ErrCQOverflow)
	require.True(t, cq.Overflowed())
	require.Equal(t, 3, cq.Len())
	buf := make([]WC, 8)
	require.Equal(t, 3, cq.Poll(buf))
	for i := 0; i < 3; i++ {
		require.Equal(t, uint64(i), buf[i].ID, "the dropped completion must not replace a queued one")
	}
	// Room again: pushes work, the flag stays set.
	require.NoError(t, cq.Push(wcID(4)))
	require.True(t, cq.Overflowed())
	// A dropped completion does not fire a notification.
	cq2, _ := NewCQ(1)
	require.NoError(t, cq2.Push(wcID(1)))
	require.NoError(t, cq2.ReqNotify(false))
	require.ErrorIs(t, cq2.Push(wcID(2)), ErrCQOverflow)
	require.Zero(t, cq2.Notifications())
}

func TestCQConcurrentProducers(t *testing.T) {
	const producers, each = 8, 2000
	// Big enough never to overflow, so every completion must arrive.
	cq, err := NewCQ(producers * each)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if err := cq.Push(WC{ID: uint64(p)<<32 | uint64(i), QPNum: uint32(p)}); err != nil {
					t.Error(err)
					return
				}
			}
		}(p)
	}
	nextSeq := make([]uint64, producers)
	buf := make([]WC, 16)
	got := 0
	ctx := context.Background()
	for got < producers*each {
		n, err := cq.WaitPoll(ctx, buf)
		require.NoError(t, err)
		for _, wc := range buf[:n] {
			p := wc.ID >> 32
			require.Equal(t, uint32(p), wc.QPNum)
			require.Equal(t, nextSeq[p], wc.ID&0xFFFFFFFF, "per-producer order")
			nextSeq[p]++
		}
		got += n
	}
	wg.Wait()
	require.Zero(t, cq.Len())
	require.False(t, cq.Overflowed())
	for p := range nextSeq {
		require.Equal(t, uint64(each), nextSeq[p])
	}
}

// One arm fires exactly once however many goroutines push at the same time.
func TestCQConcurrentNotifyFiresOnce(t *testing.T) {
	cq, err := NewCQ(1024)
	require.NoError(t, err)
	for round := 0; round < 20; round++ {
		var handled sync.WaitGroup
		handled.Add(1)
		cq.SetNotifyHandler(func(*CQ) { handled.Done() })
		require.NoError(t, cq.ReqNotify(false))
		var wg sync.WaitGroup
		for p := 0; p < 4; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 8; i++ {
					if err := cq.Push(wcID(uint64(i))); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		wg.Wait()
		handled.Wait() // a second call would panic on a negative counter
		require.Equal(t, uint64(round+1), cq.Notifications())
		requireEvent(t, cq.Notify())
		requireNoEvent(t, cq.Notify())
		require.Equal(t, 32, cq.Poll(make([]WC, 64)))
	}
}

func TestCQNotifyNextCompletion(t *testing.T) {
	cq, err := NewCQ(8)
	require.NoError(t, err)
	require.NoError(t, cq.Push(wcID(1))) // not armed: nothing
	require.Zero(t, cq.Notifications())
	requireNoEvent(t, cq.Notify())

	require.NoError(t, cq.ReqNotify(false))
	requireNoEvent(t, cq.Notify()) // queued completions do not fire on arming
	require.NoError(t, cq.Push(wcID(2)))
	requireEvent(t, cq.Notify())
	require.Equal(t, uint64(1), cq.Notifications())

	require.NoError(t, cq.Push(wcID(3))) // disarmed after firing once
	requireNoEvent(t, cq.Notify())
	require.Equal(t, uint64(1), cq.Notifications())

	require.NoError(t, cq.ReqNotify(false))
	require.NoError(t, cq.ReqNotify(false)) // arming twice still fires once
	require.NoError(t, cq.Push(wcID(4)))
	require.NoError(t, cq.Push(wcID(5)))
	requireEvent(t, cq.Notify())
	requireNoEvent(t, cq.Notify())
	require.Equal(t, uint64(2), cq.Notifications())
}

func TestCQNotifySolicitedOnly(t *testing.T) {
	cq, err := NewCQ(16)
	require.NoError(t, err)
	require.NoError(t, cq.ReqNotify(true))
	require.NoError(t, cq.Push(WC{ID: 1, Opcode: WCRecv})) // unsolicited success
	requireNoEvent(t, cq.Notify())
	require.NoError(t, cq.Push(WC{ID: 2, Opcode: WCRecv, Solicited: true}))
	requireEvent(t, cq.Notify())

	require.NoError(t, cq.ReqNotify(true))
	require.NoError(t, cq.Push(WC{ID: 3, Opcode: WCSend}))
	requireNoEvent(t, cq.Notify())
	require.NoError(t, cq.Push(WC{ID: 4, Status: WCWRFlushErr})) // errors always fire
	requireEvent(t, cq.Notify())

	// Arming for any completion takes precedence over solicited-only, in
	// either order.
	require.NoError(t, cq.ReqNotify(false))
	require.NoError(t, cq.ReqNotify(true))
	require.NoError(t, cq.Push(WC{ID: 5}))
	requireEvent(t, cq.Notify())
	require.NoError(t, cq.ReqNotify(true))
	require.NoError(t, cq.ReqNotify(false))
	require.NoError(t, cq.Push(WC{ID: 6}))
	requireEvent(t, cq.Notify())
	require.Equal(t, uint64(4), cq.Notifications())
}

func TestCQNotifyHandlerCanRearm(t *testing.T) {
	cq, err := NewCQ(8)
	require.NoError(t, err)
	var calls int
	cq.SetNotifyHandler(func(c *CQ) {
		calls++
		require.Same(t, cq, c)
		// Handlers run without CQ locks: they may poll and re-arm.
		buf := make([]WC, 8)
		c.Poll(buf)
		require.NoError(t, c.ReqNotify(false))
	})
	require.NoError(t, cq.ReqNotify(false))
	for i := 0; i < 5; i++ {
		require.NoError(t, cq.Push(wcID(uint64(i))))
	}
	require.Equal(t, 5, calls)
	require.Zero(t, cq.Len())
	// The channel merges events nobody read.
	requireEvent(t, cq.Notify())
	requireNoEvent(t, cq.Notify())
	cq.SetNotifyHandler(nil)
	require.NoError(t, cq.Push(wcID(9)))
	require.Equal(t, 5, calls)
}

func TestCQWait(t *testing.T) {
	cq, err := NewCQ(4)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, cq.Wait(ctx), context.Canceled)

	require.NoError(t, cq.Push(wcID(1)))
	require.NoError(t, cq.Wait(context.Background()), "non-empty CQ returns at once")
	cq.Poll(make([]WC, 4))

	done := make(chan error, 1)
	go func() { done <- cq.Wait(context.Background()) }()
	require.NoError(t, cq.Push(wcID(2)))
	require.NoError(t, <-done)

	got := make(chan int, 1)
	go func() {
		n, err := cq.WaitPoll(context.Background(), make([]WC, 4))
		if err != nil {
			n = -1
		}
		got <- n
	}()
	require.Equal(t, 1, <-got) // the completion pushed above

	// A context that can be done waits in a select: a Push wakes it, and
	// so does its cancellation.
	live, stop := context.WithCancel(context.Background())
	go func() { done <- cq.Wait(live) }()
	require.NoError(t, cq.Push(wcID(3)))
	require.NoError(t, <-done)
	cq.Poll(make([]WC, 4))
	waiting := make(chan struct{})
	go func() {
		close(waiting)
		done <- cq.Wait(live)
	}()
	<-waiting
	stop()
	require.ErrorIs(t, <-done, context.Canceled)

	go func() { done <- cq.Wait(context.Background()) }()
	cq.Close()
	require.ErrorIs(t, <-done, ErrCQClosed)

	_, err = cq.WaitPoll(context.Background(), nil)
	require.Error(t, err)
}

func TestCQResize(t *testing.T) {
	cq, err := NewCQ(4)
	require.NoError(t, err)
	buf := make([]WC, 4)
	// Move head off zero so the copy has to unwrap.
	for i := 0; i < 3; i++ {
		require.NoError(t, cq.Push(wcID(100)))
	}
	cq.Poll(buf[:3])
	for i := uint64(0); i < 4; i++ {
		require.NoError(t, cq.Push(wcID(i)))
	}
	require.ErrorIs(t, cq.Resize(3), ErrCQSize)
	require.ErrorIs(t, cq.Resize(0), ErrCQSize)
	require.Equal(t, 4, cq.Cap(), "failed resize changes nothing")
	require.NoError(t, cq.Resize(6))
	require.Equal(t, 6, cq.Cap())
	require.NoError(t, cq.Push(wcID(4)))
	require.NoError(t, cq.Push(wcID(5)))
	out := make([]WC, 8)
	require.Equal(t, 6, cq.Poll(out))
	for i := 0; i < 6; i++ {
		require.Equal(t, uint64(i), out[i].ID)
	}
	require.NoError(t, cq.Resize(1))
	cq.Close()
	require.ErrorIs(t, cq.Resize(2), ErrCQClosed)
}

func TestCQClose(t *testing.T) {
	cq, err := NewCQ(4)
	require.NoError(t, err)
	require.NoError(t, cq.Push(wcID(7)))
	cq.Close()
	cq.Close()
	require.ErrorIs(t, cq.Push(wcID(8)), ErrCQClosed)
	require.ErrorIs(t, cq.ReqNotify(false), ErrCQClosed)
	buf := make([]WC, 2)
	require.Equal(t, 1, cq.Poll(buf), "queued completions survive Close")
	require.Equal(t, uint64(7), buf[0].ID)
	require.ErrorIs(t, cq.Wait(context.Background()), ErrCQClosed)
}

func TestCQNoAllocs(t *testing.T) {
	cq, err := NewCQ(64)
	require.NoError(t, err)
	buf := make([]WC, 16)
	require.NoError(t, cq.ReqNotify(false))
	allocs := testing.AllocsPerRun(100, func() {
		for i := 0; i < 16; i++ {
			_ = cq.Push(wcID(uint64(i)))
		}
		_ = cq.ReqNotify(true)
		cq.Poll(buf)
	})
	require.Zero(t, allocs)
}

func BenchmarkCQPushPoll(b *testing.B) {
	cq, _ := NewCQ(1024)
	buf := make([]WC, 32)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		_ = cq.Push(wcID(uint64(i)))
		if i%32 == 31 {
			cq.Poll(buf)
		}
	}
}

func BenchmarkCQContended(b *testing.B) {
	cq, _ := NewCQ(4096)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]WC, 8)
		for pb.Next() {
			if cq.Push(wcID(1)) != nil {
				cq.Poll(buf)
			}
		}
	})
}

func requireEvent(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	default:
		t.Fatal("expected a notification")
	}
}

func requireNoEvent(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
		t.Fatal("unexpected notification")
	default:
	}
}
