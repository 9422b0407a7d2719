package ib_test

import (
	"encoding/binary"
	"sync"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// Fetch-and-adds from several QPs, posted by several goroutines, on one
// remote word are atomic with respect to each other: the sum is exact and
// every operation saw a different original value.
func TestConcurrentAtomicsExactSum(t *testing.T) {
	const qps, perQP, depth = 4, 200, 8
	net := transport.NewMemNetwork()
	a, b := openPeer(net, "10.7.0.1"), openPeer(net, "10.7.0.2")
	defer a.close()
	defer b.close()
	target := b.mr.IOVA() + 4096
	type worker struct {
		q  *ib.QP
		cq *ib.CQ
	}
	ws := make([]worker, qps)
	for i := range ws {
		cq, err := a.dev.CreateCQ(depth * 2)
		require.NoError(t, err)
		q, err := a.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
			Cap: ib.QPCap{MaxSendWR: depth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
		require.NoError(t, err)
		peerQ := b.createQP(ib.RC)
		connectBoth(a, q, b, peerQ)
		ws[i] = worker{q, cq}
	}
	origs := make([][]uint64, qps)
	errs := make(chan error, qps)
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each in-flight WR owns an 8-byte slot of this worker's part
			// of a's buffer, reused once its completion is polled.
			base := 8192 * (i + 1)
			posted, done := 0, 0
			wcs := make([]ib.WC, depth)
			for done < perQP {
				for posted < perQP && posted-done < depth {
					slot := posted % depth
					err := w.q.PostSend(ib.SendWR{ID: uint64(slot), Opcode: ib.WRAtomicFetchAndAdd, Flags: ib.SendSignaled,
						SGL: []ib.SGE{a.sge(base+8*slot, 8)}, RemoteAddr: target, RKey: b.mr.RKey(), CompareAdd: uint64(i + 1)})
					if err != nil {
						errs <- err
						return
					}
					posted++
				}
				wc := next(w.cq)
				n := 1
				wcs[0] = wc
				n += w.cq.Poll(wcs[1:])
				for _, wc := range wcs[:n] {
					if wc.Status != ib.WCSuccess {
						errs <- wc.Status.Err()
						return
					}
					origs[i] = append(origs[i], binary.NativeEndian.Uint64(a.buf[base+8*int(wc.ID):]))
					done++
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := uint64(0)
	for i := range qps {
		want += uint64(perQP * (i + 1))
	}
	require.Equal(t, want, binary.NativeEndian.Uint64(b.buf[4096:]))
	seen := map[uint64]bool{}
	for _, os := range origs {
		require.Len(t, os, perQP)
		for _, o := range os {
			require.False(t, seen[o], "two fetch-adds saw %d", o)
			seen[o] = true
		}
	}
}
