package ib_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// TestCQSharedByWaiters: goroutines waiting on one CQ, with WaitPoll and
// with HybridWaiters, while a peer's SENDs complete receives on it, as
// the CQ's doc allows ("two goroutines polling one CQ each get distinct
// completions, in queue order overall"): every completion reaches
// exactly one of them, each sees its share in queue order, and the
// waiters left when the work is done end by their ctx, saying why.
func TestCQSharedByWaiters(t *testing.T) {
	const (
		msgs    = 600
		waiters = 4
		depth   = 16
	)
	net := transport.NewMemNetwork()
	a, b := openPeer(net, "10.57.0.1"), openPeer(net, "10.57.0.2")
	defer a.close()
	defer b.close()
	rcq, err := b.dev.CreateCQ(4 * depth)
	require.NoError(t, err)
	qa := a.createQP(ib.RC)
	qb, err := b.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: b.cq, RecvCQ: rcq,
		Cap: ib.QPCap{MaxSendWR: 4, MaxRecvWR: depth, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	connectRC(a, qa, b, qb)
	connectRC(b, qb, a, qa)

	// The receives are posted in ID order and a QP completes them in
	// that order; the waiters repost under a lock, so the queue's order
	// stays the IDs' order.
	var postMu sync.Mutex
	nextRecv := uint64(0)
	post := func() error {
		postMu.Lock()
		defer postMu.Unlock()
		if nextRecv >= msgs {
			return nil
		}
		id := nextRecv
		nextRecv++
		return qb.PostRecv(ib.RecvWR{ID: id, SGL: []ib.SGE{b.sge(0, 64)}})
	}
	for range depth {
		require.NoError(t, post())
	}

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	allIn := errors.New("every completion taken")
	var got atomic.Int64
	seen := make([][]uint64, waiters)
	errs := make([]error, waiters)
	var wg sync.WaitGroup
	for w := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var hw ib.HybridWaiter
			wcs := make([]ib.WC, 3)
			for {
				var n int
				var err error
				if w%2 == 0 {
					n, err = rcq.WaitPoll(ctx, wcs)
				} else {
					n, err = hw.Wait(ctx, rcq, wcs)
				}
				if err != nil {
					errs[w] = err
					return
				}
				for _, wc := range wcs[:n] {
					if wc.Status != ib.WCSuccess {
						errs[w] = errors.New(wc.Status.String())
						cancel(errs[w])
						return
					}
					seen[w] = append(seen[w], wc.ID)
					if err := post(); err != nil {
						errs[w] = err
						cancel(err)
						return
					}
				}
				if got.Add(int64(n)) == msgs {
					cancel(allIn)
				}
			}
		}()
	}
	sendCtx, stop := context.WithTimeout(ctx, 20e9)
	defer stop()
	for i := range msgs {
		for {
			err := qa.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRSend, SGL: []ib.SGE{a.sge(0, 64)}, Flags: ib.SendSignaled})
			if errors.Is(err, ib.ErrSendFull) {
				_, err = a.cq.WaitPoll(sendCtx, make([]ib.WC, 16))
			} else if err == nil {
				break
			}
			require.NoError(t, err)
		}
	}
	wg.Wait()
	total := map[uint64]int{}
	for w := range waiters {
		require.ErrorIs(t, errs[w], context.Canceled, "waiter %d", w)
		require.ErrorIs(t, errs[w], allIn, "waiter %d ended because the work was done", w)
		for i, id := range seen[w] {
			total[id]++
			if i > 0 {
				require.Less(t, seen[w][i-1], id, "waiter %d took its completions out of queue order", w)
			}
		}
	}
	require.Len(t, total, msgs)
	for id, n := range total {
		require.Equal(t, 1, n, "completion %d taken %d times", id, n)
	}
}
