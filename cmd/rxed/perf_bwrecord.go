package main

import (
	"time"

	"github.com/rxed/rxed/pkg/oob"
)

// bwRecord keeps the timestamps a bandwidth run's report is computed
// from. An -n run keeps one post and one completion time per work
// request, as perftest's tposted/tcompleted, for the peak search (memory
// bounded by -n, allocated up front). A -D run keeps only the first post
// and the last completion: perftest's duration mode reports no peak
// (0.00) and its average from the sampled interval, and a per-WR sample
// there grew with the run's length without bound (16 bytes and more a
// message: 355 MB of RSS after 200 s of 4 KiB writes, gigabytes for an
// hour of small messages), while the report read the two ends only.
type bwRecord struct {
	every             bool            // -n: one sample per work request
	posted, completed []time.Duration // every: by post order
	// -D: how many were posted, the first post and the last completion.
	n           uint64
	first, last time.Duration
}

// newBWRecord prepares the record of a run of iters work requests, or
// of a timed run when iters is 0.
func newBWRecord(iters uint64) *bwRecord {
	if iters == 0 {
		return &bwRecord{}
	}
	return &bwRecord{every: true,
		posted:    make([]time.Duration, 0, iters),
		completed: make([]time.Duration, 0, iters)}
}

// bwRecord is the record of a bandwidth run on qps QPs: a sample per
// work request for -n (allocated here: no growing, and no garbage, in
// the loop), the run's two ends for -D (memory that does not grow with
// the run).
func (o *perfOpts) bwRecord(qps int) *bwRecord {
	if o.duration > 0 {
		return newBWRecord(0)
	}
	return newBWRecord(o.iters * uint64(qps))
}

// post records a work request posted at at (since the run's start) and
// returns the index its completion is recorded under.
func (b *bwRecord) post(at time.Duration) int {
	if !b.every {
		if b.n == 0 {
			b.first = at
		}
		b.n++
		return 0
	}
	b.posted = append(b.posted, at)
	b.completed = append(b.completed, 0)
	return len(b.posted) - 1
}

// complete records that the work request post returned idx for
// completed at at.
func (b *bwRecord) complete(idx int, at time.Duration) {
	if !b.every {
		b.last = max(b.last, at)
		return
	}
	b.completed[idx] = at
}

// kept is how many timestamps the record holds: what its memory grows
// with.
func (b *bwRecord) kept() int { return len(b.posted) + len(b.completed) }

// report computes the run's figures: for -n perftest's peak and average
// (computeBW), for -D the average over first post to last completion,
// peak 0 as perftest prints it in duration mode.
func (b *bwRecord) report(size uint64, cqMod int, gbits bool) (oob.BWReport, error) {
	if b.every {
		return computeBW(size, b.posted, b.completed, cqMod, gbits)
	}
	if b.n == 0 {
		return oob.BWReport{}, errNoIterations
	}
	return oob.AverageBW(size, b.n, b.last-b.first, gbits), nil
}
