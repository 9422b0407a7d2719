package ib

import (
	"runtime"
	"sync/atomic"
	"time"
)

// spinYield makes a goroutine that spins on CQ.Poll yield its P now and
// then, before the runtime does it for it with a signal.
//
// Why: Poll yields (runtime.Gosched) only when it finds nothing at all.
// A spinner that always finds something (its peer is an engine of the
// same process, whose answer Poll's own progress brings in; a stream of
// completions) never does, and the runtime preempts a goroutine that has
// run 10 ms on its P without scheduling (sysmon's forcePreemptNS) by
// sending its thread a signal. Measured, an 8-byte WRITE round trip in
// poll mode, 100,000 of them: 72 such signals made the 99th percentile
// 33-42 us against 19-23 us with GODEBUG=asyncpreemptoff=1 (the runtime
// then preempts at the next function call, without a signal), the median
// unchanged (docs/performance.md, session N). A voluntary yield every
// spinYieldEvery keeps the P's schedule tick moving, so the runtime never
// needs to.
type spinYield struct {
	calls   atomic.Uint32
	yielded atomic.Int64 // when Poll last yielded here, ns since spinEpoch
}

// spinYieldEvery is well inside the runtime's 10 ms, and long enough that
// the yields themselves (each wakes an idle thread, goschedImpl's wakep)
// stay rare: the WRITE / READ round trips' p99, medians of 4 runs of
// 100,000 alternating, were 21.6 / 23.1 us yielding every 1 ms, 22.0 /
// 23.7 every 2 ms, 20.5 / 21.4 every 5 ms and 19.5 / 21.6 every 8 ms.
const spinYieldEvery = 5 * time.Millisecond

// spinCheckEvery: the clock is read on one Poll call in this many.
const spinCheckEvery = 16

var spinEpoch = time.Now()

// maybeYield yields if the last yield here was spinYieldEvery ago.
func (s *spinYield) maybeYield() {
	if s.calls.Add(1)%spinCheckEvery != 0 {
		return
	}
	if s.due(int64(time.Since(spinEpoch))) {
		runtime.Gosched()
	}
}

// due reports whether a yield is due at now, and records it if so.
func (s *spinYield) due(now int64) bool {
	last := s.yielded.Load()
	if now-last < int64(spinYieldEvery) || !s.yielded.CompareAndSwap(last, now) {
		return false
	}
	return true
}
