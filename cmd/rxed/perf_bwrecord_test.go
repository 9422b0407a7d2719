package main

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPerfDurationRunKeepsNoSamplePerWorkRequest: a -D bandwidth run's
// memory does not grow with its length. Bug (soak, 200 s of `perf write
// -D 200 -s 4096` under --fault loss=0.02): the client's RSS went from
// 15 MB to 355 MB, a posted and a completed timestamp kept per work
// request (9.4 M of them) for a report that read only the first and the
// last, since -D reports no peak.
func TestPerfDurationRunKeepsNoSamplePerWorkRequest(t *testing.T) {
	o, code, ok := parsePerf([]string{"write", "--addr", "127.0.0.1", "-D", "30", "127.0.0.2"}, io.Discard)
	require.True(t, ok, "exit %d", code)
	rec := o.bwRecord(2)
	const n = 100000
	us := time.Microsecond
	for i := range n {
		idx := rec.post(time.Duration(i) * us)
		rec.complete(idx, time.Duration(i)*us+7*us)
	}
	require.Zero(t, rec.kept(), "timestamps kept after %d work requests of a -D run", n)
	rep, err := rec.report(4096, 1, false)
	require.NoError(t, err)
	require.EqualValues(t, n, rep.Iters)
	require.Zero(t, rep.BWPeak, "perftest's duration mode prints no peak")
	// The average runs from the first post to the last completion, as
	// the per-WR samples' computeBW did.
	all := make([]time.Duration, n)
	done := make([]time.Duration, n)
	for i := range n {
		all[i], done[i] = time.Duration(i)*us, time.Duration(i)*us+7*us
	}
	want, err := computeBW(4096, all, done, 1, false)
	require.NoError(t, err)
	require.InDelta(t, want.BWAvg, rep.BWAvg, 1e-9)
	require.InDelta(t, want.MsgRateAvg, rep.MsgRateAvg, 1e-12)
}

// TestPerfIterationRunKeepsEverySample: an -n run keeps a post and a
// completion time per work request, allocated up front, for perftest's
// peak search.
func TestPerfIterationRunKeepsEverySample(t *testing.T) {
	o, code, ok := parsePerf([]string{"write", "--addr", "127.0.0.1", "-n", "100", "127.0.0.2"}, io.Discard)
	require.True(t, ok, "exit %d", code)
	rec := o.bwRecord(2)
	require.Equal(t, 200, cap(rec.posted))
	for i := range 200 {
		rec.complete(rec.post(time.Duration(i)*time.Microsecond), time.Duration(i+3)*time.Microsecond)
	}
	require.Equal(t, 400, rec.kept())
	rep, err := rec.report(4096, 1, false)
	require.NoError(t, err)
	require.EqualValues(t, 200, rep.Iters)
	require.Positive(t, rep.BWPeak)
}

// TestPerfDurationRunWithNothingPostedFails: a -D run that posted
// nothing has no report, as computeBW says for -n.
func TestPerfDurationRunWithNothingPostedFails(t *testing.T) {
	_, err := newBWRecord(0).report(4096, 1, false)
	require.ErrorIs(t, err, errNoIterations)
}
