package transport

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBatchPoolTakesWhatWasPut(t *testing.T) {
	p := newBatchPool()
	require.Nil(t, p.tryGet(), "empty")
	bs := make([]*rxBatch, MaxLentBatches)
	for i := range bs {
		bs[i] = &rxBatch{n: i}
		p.put(bs[i])
	}
	seen := map[*rxBatch]bool{}
	for range bs {
		b := p.tryGet()
		require.NotNil(t, b)
		require.False(t, seen[b], "a batch handed out twice")
		seen[b] = true
	}
	require.Nil(t, p.tryGet(), "all taken")
	require.Len(t, seen, MaxLentBatches)
}

// TestBatchPoolGetWaitsForPut: a get that finds nothing sleeps until a
// batch is put, and takes that batch.
func TestBatchPoolGetWaitsForPut(t *testing.T) {
	p := newBatchPool()
	done := make(chan struct{})
	got := make(chan *rxBatch)
	go func() { got <- p.get(done) }()
	for p.waiters.Load() == 0 { // the getter has counted itself: it is going to sleep
		runtime.Gosched()
	}
	b := &rxBatch{}
	p.put(b)
	require.Same(t, b, <-got)
	require.Zero(t, p.waiters.Load())
}

// TestBatchPoolWakesEveryWaiter: two gets asleep at once, two puts: both
// wake (a put while someone waits leaves a token of its own).
func TestBatchPoolWakesEveryWaiter(t *testing.T) {
	p := newBatchPool()
	done := make(chan struct{})
	got := make(chan *rxBatch, 2)
	for range 2 {
		go func() { got <- p.get(done) }()
	}
	for p.waiters.Load() < 2 {
		runtime.Gosched()
	}
	for range 100 { // let both reach their select (counted, they may still be looking)
		runtime.Gosched()
	}
	b1, b2 := &rxBatch{n: 1}, &rxBatch{n: 2}
	p.put(b1)
	p.put(b2)
	x, y := <-got, <-got
	require.ElementsMatch(t, []*rxBatch{b1, b2}, []*rxBatch{x, y})
}

func TestBatchPoolGetEndsWhenDone(t *testing.T) {
	p := newBatchPool()
	done := make(chan struct{})
	got := make(chan *rxBatch)
	go func() { got <- p.get(done) }()
	for p.waiters.Load() == 0 {
		runtime.Gosched()
	}
	close(done)
	require.Nil(t, <-got)
	require.Zero(t, p.waiters.Load())
}

// TestBatchPoolConcurrent: goroutines taking (some waiting) and returning
// a socket's MaxLentBatches batches never hold one batch twice, and every
// batch is back at the end (run it with -race).
func TestBatchPoolConcurrent(t *testing.T) {
	p := newBatchPool()
	held := map[*rxBatch]*atomic.Bool{}
	for range MaxLentBatches {
		b := &rxBatch{}
		held[b] = new(atomic.Bool)
		p.put(b)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 2 * MaxLentBatches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				var b *rxBatch
				if (g+i)%2 == 0 {
					b = p.get(done)
				} else if b = p.tryGet(); b == nil {
					continue
				}
				if !held[b].CompareAndSwap(false, true) {
					t.Error("a batch handed out while held")
					return
				}
				runtime.Gosched()
				held[b].Store(false)
				p.put(b)
			}
		}()
	}
	wg.Wait()
	n := 0
	for p.tryGet() != nil {
		n++
	}
	require.Equal(t, MaxLentBatches, n)
}
