package main

import (
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/rxed/rxed/pkg/oob"
	"github.com/stretchr/testify/require"
)

// atomicRun is the client side of an atomic run with one QP whose
// results land in buf as sendWR places them (slot seq % txDepth).
func atomicRun(kind string, txDepth int) (*perfRun, *perfQP) {
	q := &perfQP{remote: oob.Key{RKey: 1, VAddr: 0x1000}}
	r := &perfRun{o: &perfOpts{atomicType: kind, txDepth: txDepth, validate: true}, qps: []*perfQP{q},
		buf: make([]byte, 8*txDepth), peer: true}
	r.o.test.Verb = oob.VerbAtomic
	return r, q
}

// complete lands v as the result of atomic seq and checks it.
func complete(r *perfRun, q *perfQP, s *bwQP, seq, v uint64) error {
	off := q.src + int(seq%uint64(r.o.txDepth))*8
	binary.NativeEndian.PutUint64(r.buf[off:off+8], v)
	return r.checkCompletion(q, s, seq, 8)
}

// retainedHeap is the live heap after a collection.
func retainedHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestAtomicValidationMemoryIsBounded: perf atomic -D --validate checks
// each atomic's result as it completes and keeps no value per atomic: it
// kept all of them (8 bytes each) until the run ended, so a long -D run
// grew without bound. Not parallel: it measures the live heap.
func TestAtomicValidationMemoryIsBounded(t *testing.T) {
	const n = 2 << 20 // 16 MiB of results if they were kept
	for _, kind := range []string{"FETCH_AND_ADD", "CMP_AND_SWAP"} {
		t.Run(kind, func(t *testing.T) {
			r, q := atomicRun(kind, 128)
			st := make([]bwQP, 1)
			before := retainedHeap()
			for seq := range uint64(n) {
				v := seq // FETCH_AND_ADD from 0
				if kind == "CMP_AND_SWAP" {
					v = perfSwapValue
					if seq == 0 {
						v = 0
					}
				}
				require.NoError(t, complete(r, q, &st[0], seq, v))
			}
			grown := int64(retainedHeap()) - int64(before)
			require.NoError(t, r.checkAtomicResults(st))
			runtime.KeepAlive(st)
			require.Lessf(t, grown, int64(4<<20), "%d atomics' validation holds %d bytes", n, grown)
		})
	}
}

// TestAtomicCheckRunsBoundedByOutstanding: QPs that share a target (a
// perftest server's buffer) complete their FETCH_AND_ADDs interleaved and
// late, and the check holds at most one run of values more than there are
// atomics outstanding, however long the run: a gap is an atomic executed
// whose completion has not come yet.
func TestAtomicCheckRunsBoundedByOutstanding(t *testing.T) {
	t.Parallel()
	const qps, txDepth, n = 4, 16, 200000
	rng := rand.New(rand.NewPCG(7, 7))
	c := &atomicCheck{}
	var next uint64                   // the target's value: the next add returns it
	inflight := make([][]uint64, qps) // per QP: values executed, not completed, oldest first
	outstanding, maxRuns := 0, 0
	for done := 0; done < n; {
		i := rng.IntN(qps)
		if len(inflight[i]) < txDepth && rng.IntN(2) == 0 {
			inflight[i] = append(inflight[i], next)
			next++
			outstanding++
			continue
		}
		if len(inflight[i]) == 0 {
			continue
		}
		// A QP's completions come in order.
		require.NoError(t, c.add(inflight[i][0]))
		inflight[i] = inflight[i][1:]
		outstanding--
		done++
		require.LessOrEqual(t, len(c.runs), outstanding+1)
		maxRuns = max(maxRuns, len(c.runs))
	}
	for i := range inflight {
		for _, v := range inflight[i] {
			require.NoError(t, c.add(v))
		}
	}
	require.NoError(t, c.finish(true))
	require.LessOrEqual(t, maxRuns, qps*txDepth+1)
	require.Greater(t, maxRuns, 1, "the QPs' results never interleaved: the test shows nothing")
}
