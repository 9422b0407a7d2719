package oob

import (
	"errors"
	"fmt"
	"time"
)

// BWSamples are the timestamps of a bandwidth run, as perftest records them
// (tposted and tcompleted), measured from any fixed origin.
type BWSamples struct {
	Size uint64 // message size
	// Posted[i] is when iteration i was posted and Completed[i] when the
	// completion covering it was polled (with completion moderation one
	// completion covers CQMod iterations: give them all its time). Both
	// have one entry per iteration of all QPs.
	Posted, Completed []time.Duration
	CQMod             int  // completion moderation (-Q); 0 means 1
	PostList          int  // post list (-l); 0 means 1
	NoPeak            bool // -N: skip the peak search; Completed[0] then holds the end of the run
	Gbits             bool // --report_gbits: Gb/s instead of MB/s
}

// ComputeBW does what perftest's print_report_bw computes for an iteration
// run: the average over the whole run, the message rate, and the peak as the
// best per-iteration time over every completion-aligned window (whose cost
// grows with the square of the iterations divided by CQMod, as in
// perftest). Bandwidth is in MB/s (2^20 bytes) or Gb/s (10^9 bits).
func ComputeBW(s BWSamples) (BWReport, error) {
	n := len(s.Posted)
	if n == 0 || len(s.Completed) != n {
		return BWReport{}, fmt.Errorf("oob: bandwidth run with %d posted and %d completed timestamps", n, len(s.Completed))
	}
	cqMod, postList := max(s.CQMod, 1), max(s.PostList, 1)
	optDelta := s.Completed[0] - s.Posted[0]
	if !s.NoPeak {
		for i := 0; i < n; i += postList {
			for j := roundUp(i+1, cqMod) - 1; j < n; j += cqMod {
				if t := (s.Completed[j] - s.Posted[i]) / time.Duration(j-i+1); t < optDelta {
					optDelta = t
				}
			}
			// The last iteration is always signalled.
			if n%cqMod != 0 {
				j := n - 1
				if t := (s.Completed[j] - s.Posted[i]) / time.Duration(j-i+1); t < optDelta {
					optDelta = t
				}
			}
		}
	}
	last := n - 1
	if s.NoPeak {
		last = 0
	}
	total := s.Completed[last] - s.Posted[0]
	if total <= 0 {
		return BWReport{}, errors.New("oob: bandwidth run has no duration")
	}
	r := AverageBW(s.Size, uint64(n), total, s.Gbits)
	if !s.NoPeak {
		r.BWPeak = float64(s.Size) * unitsPerSec / (float64(optDelta) * bwUnit(s.Gbits))
	}
	return r, nil
}

const unitsPerSec = float64(time.Second)

// bwUnit is the bytes per second of one reported unit: perftest's MB/s
// (2^20 bytes) or, with --report_gbits, Gb/s (10^9 bits).
func bwUnit(gbits bool) float64 {
	if gbits {
		return 125000000
	}
	return 0x100000
}

// AverageBW is print_report_bw's average of a run that moved iters
// messages of size bytes in d: bandwidth (bwUnit) and message rate
// (millions per second), no peak. d below 1 ns counts as 1 ns.
func AverageBW(size, iters uint64, d time.Duration, gbits bool) BWReport {
	total := float64(max(d, 1))
	return BWReport{
		Size:       size,
		Iters:      iters,
		BWAvg:      float64(size) * float64(iters) * unitsPerSec / (total * bwUnit(gbits)),
		MsgRateAvg: float64(iters) * unitsPerSec / (total * 1000000),
	}
}

func roundUp(v, m int) int { return (v + m - 1) / m * m }
