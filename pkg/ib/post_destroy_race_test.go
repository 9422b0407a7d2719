package ib_test

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// posted is one work request a poster tried: its ID, whether it was
// accepted, and how many resets had finished before its post began.
type posted struct {
	id           uint64
	ok           bool
	resetsBefore int64
	afterDestroy bool // Destroy had returned before the post began
}

// Posts race with Modify to RESET and with Destroy through the verbs API
// and the engine: goroutines post UD sends (to the QP itself) and
// receives without pause while the test cycles the QP RESET -> INIT ->
// RTR -> RTS (sometimes through ERR), then destroys it under their feet.
// Every accepted WR completes at most once, with SUCCESS or WR_FLUSH_ERR;
// refused ones never complete; those posted after the last reset
// finished all complete once the QP is moved to ERR; a post begun after Destroy
// returned fails with ErrDestroyed, and the destroyed QP completes
// nothing more.
//
// Regression test: was TestRegressPostRacesResetAndDestroy in regress_postdestroy_test.go
// (added in commit 7d1552a).
func TestPostRacesResetAndDestroy(t *testing.T) {
	cycles := 150
	if testing.Short() {
		cycles = 40
	}
	net := transport.NewMemNetwork()
	a := openPeer(net, "10.13.0.1")
	defer a.close()
	scq, err := a.dev.CreateCQ(4096)
	require.NoError(t, err)
	rcq, err := a.dev.CreateCQ(4096)
	require.NoError(t, err)
	q, err := a.pd.CreateQP(ib.QPInitAttr{Type: ib.UD, SendCQ: scq, RecvCQ: rcq,
		Cap: ib.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	ah, err := a.pd.CreateAH(ib.AHAttr{DGID: a.addr, DestPort: a.dev.UDPPort(), PortNum: 1})
	require.NoError(t, err)
	const qkey = 0x2222
	toRTS := func() {
		require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, QKey: qkey},
			ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrQKey))
		runtime.Gosched()
		require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState))
		runtime.Gosched()
		require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSRTS, SQPSN: 1}, ib.AttrState|ib.AttrSQPSN))
	}

	var resets atomic.Int64
	var destroyed atomic.Bool
	var postsAfterDestroy atomic.Int64 // synchronises phase 2 on a refused post
	completions := map[uint64]int{}
	var badStatus []ib.WC
	wcs := make([]ib.WC, 64)
	drain := func() int {
		total := 0
		for _, cq := range []*ib.CQ{scq, rcq} {
			for {
				n := cq.Poll(wcs)
				for _, wc := range wcs[:n] {
					completions[wc.ID]++
					if wc.Status != ib.WCSuccess && wc.Status != ib.WCWRFlushErr {
						badStatus = append(badStatus, wc)
					}
				}
				total += n
				if n < len(wcs) {
					break
				}
			}
		}
		return total
	}

	// posters run until stop closes; phase makes IDs unique across runs.
	var logs [][]posted
	runPosters := func(phase uint64, stop <-chan struct{}) *sync.WaitGroup {
		const senders, receivers = 2, 1
		logs = append(logs, make([][]posted, senders+receivers)...)
		base := len(logs) - senders - receivers
		var wg sync.WaitGroup
		for g := range senders + receivers {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				lg := &logs[base+g]
				for seq := uint64(1); ; seq++ {
					select {
					case <-stop:
						return
					default:
					}
					id := phase<<48 | uint64(g)<<32 | seq
					p := posted{id: id, resetsBefore: resets.Load(), afterDestroy: destroyed.Load()}
					var err error
					if g < senders {
						wr := ib.SendWR{ID: id, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: []ib.SGE{a.sge(0, 16)}}
						ib.UDSend(&wr, ah, q.Num(), qkey)
						err = q.PostSend(wr)
					} else {
						err = q.PostRecv(ib.RecvWR{ID: id, SGL: []ib.SGE{a.sge(4096, 40+16)}})
					}
					p.ok = err == nil
					var pe *ib.PostError
					switch {
					case err == nil:
					case !errors.As(err, &pe):
						t.Errorf("post %#x: %v is not a *PostError", id, err)
						return
					case p.afterDestroy && !errors.Is(err, ib.ErrDestroyed):
						t.Errorf("post %#x after Destroy: %v", id, err)
						return
					case errors.Is(err, ib.ErrQPState), errors.Is(err, ib.ErrSendFull),
						errors.Is(err, ib.ErrRecvFull), errors.Is(err, ib.ErrDestroyed):
					default:
						t.Errorf("post %#x: unexpected %v", id, err)
						return
					}
					*lg = append(*lg, p)
					if p.afterDestroy {
						postsAfterDestroy.Add(1)
					}
					if seq%4 == 0 {
						runtime.Gosched()
					}
				}
			}(g)
		}
		return &wg
	}

	// Phase 1: resets.
	stop := make(chan struct{})
	wg := runPosters(1, stop)
	toRTS()
	for c := range cycles {
		if c%3 == 2 {
			require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSErr}, ib.AttrState))
		}
		drain()
		runtime.Gosched()
		require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
		resets.Add(1) // after: a post begun from here on must outlive no reset
		drain()
		toRTS()
		for range 3 {
			runtime.Gosched()
			drain()
		}
	}
	close(stop)
	wg.Wait()
	// ERR flushes, on the engine's worker before Modify returns, every WR
	// still queued.
	require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSErr}, ib.AttrState))
	drain()
	last := resets.Load()
	for _, lg := range logs {
		for _, p := range lg {
			n := completions[p.id]
			switch {
			case !p.ok:
				require.Zero(t, n, "refused WR %#x completed", p.id)
			case n > 1:
				t.Fatalf("WR %#x completed %d times", p.id, n)
			case n == 0 && p.resetsBefore == last:
				t.Fatalf("WR %#x accepted after the last reset never completed", p.id)
			}
		}
	}

	// Phase 2: Destroy under the posters' feet.
	require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
	toRTS()
	stop = make(chan struct{})
	wg = runPosters(2, stop)
	for range 20 {
		runtime.Gosched()
		drain()
	}
	require.NoError(t, q.Destroy())
	destroyed.Store(true)
	drain()
	// Wait (an event, not a number of yields: a loaded machine may not
	// schedule the posters for a while) until posts after Destroy happened.
	deadline := time.Now().Add(30 * time.Second)
	for postsAfterDestroy.Load() < 3 {
		require.True(t, time.Now().Before(deadline), "no poster ran after Destroy within 30 s")
		runtime.Gosched()
	}
	close(stop)
	wg.Wait()
	require.Zero(t, drain(), "a destroyed QP completes nothing")

	require.Empty(t, badStatus)
	accepted := map[uint64]bool{}
	var afterDestroy int
	for _, lg := range logs {
		for _, p := range lg {
			if p.ok {
				require.False(t, p.afterDestroy, "WR %#x accepted after Destroy returned", p.id)
				accepted[p.id] = true
			}
			if p.afterDestroy {
				afterDestroy++
			}
		}
	}
	for id, n := range completions {
		require.True(t, accepted[id], "completion for WR %#x that was never accepted", id)
		require.Equal(t, 1, n, "WR %#x", id)
	}
	require.NotZero(t, afterDestroy, "the posters did run after Destroy")
	require.NoError(t, scq.Destroy(), "Destroy released the CQ")
	require.NoError(t, rcq.Destroy())
}
