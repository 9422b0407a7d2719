package transport

import "sync/atomic"

// batchPool holds a socket's free receive batches: at most
// MaxLentBatches, one per slot.
//
// It replaces a buffered channel. A poller takes a batch and gives it
// back on every receive call (an empty poll gives it back at once), and a
// released lease returns one: on a ping-pong that is four channel
// operations per round trip, each taking and releasing the channel's
// lock, about 2% of an 8-byte WRITE round trip (docs/performance.md,
// session R). Here a batch is taken or returned with one compare-and-swap
// on its slot.
//
// Only a waiting get (the reader when every batch is lent out) needs more:
// it announces itself in waiters, looks again, and sleeps on wake; put
// stores its batch before it reads waiters, and get counts itself before
// it looks again, so one of the two sees the other (both are sequentially
// consistent atomics): a batch put while a get goes to sleep wakes it.
// Each such put leaves a token of its own (wake holds as many as there
// are batches), so two puts wake two sleeping gets even when neither had
// reached its wait yet. A stale token only makes a later get look once
// more. (A socket has one waiting getter at a time: its reader goroutine,
// or the Conn's receiver under waitMu.)
type batchPool struct {
	slots   [MaxLentBatches]atomic.Pointer[rxBatch]
	waiters atomic.Int32
	wake    chan struct{} // capacity MaxLentBatches
}

func newBatchPool() *batchPool { return &batchPool{wake: make(chan struct{}, MaxLentBatches)} }

// put returns b to the pool. A socket has at most MaxLentBatches
// batches, so while b is out a slot is empty; a pass can still miss it
// when other gets and puts move the empty slot behind it, so put looks
// until it finds one.
func (p *batchPool) put(b *rxBatch) {
	for {
		for i := range p.slots {
			if p.slots[i].CompareAndSwap(nil, b) {
				if p.waiters.Load() > 0 {
					select {
					case p.wake <- struct{}{}:
					default:
					}
				}
				return
			}
		}
	}
}

// tryGet takes a free batch, or returns nil when there is none.
func (p *batchPool) tryGet() *rxBatch {
	for i := range p.slots {
		if b := p.slots[i].Load(); b != nil && p.slots[i].CompareAndSwap(b, nil) {
			return b
		}
	}
	return nil
}

// get takes a free batch, waiting for one to be put; nil once done is
// closed.
func (p *batchPool) get(done <-chan struct{}) *rxBatch {
	for {
		if b := p.tryGet(); b != nil {
			return b
		}
		p.waiters.Add(1)
		if b := p.tryGet(); b != nil {
			p.waiters.Add(-1)
			return b
		}
		select {
		case <-p.wake:
			p.waiters.Add(-1)
		case <-done:
			p.waiters.Add(-1)
			return nil
		}
	}
}
