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
	const unitsPerSec = float64(time.Second)
	formatFactor := float64(0x100000)
	if s.Gbits {
		formatFactor = 125000000
	}
	last := n - 1
	if s.NoPeak {
		last = 0
	}
	total := float64(s.Completed[last] - s.Posted[0])
	if total <= 0 {
		return BWReport{}, errors.New("oob: bandwidth run has no duration")
	}
	r := BWReport{
		Size:       s.Size,
		Iters:      uint64(n),
		BWAvg:      float64(s.Size) * float64(n) * unitsPerSec / (total * formatFactor),
		MsgRateAvg: float64(n) * unitsPerSec / (total * 1000000),
	}
	if !s.NoPeak {
		r.BWPeak = float64(s.Size) * unitsPerSec / (float64(optDelta) * formatFactor)
	}
	return r, nil
}

func roundUp(v, m int) int { return (v + m - 1) / m * m }
