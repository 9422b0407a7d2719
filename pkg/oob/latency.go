package oob

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// latMeasureTail is perftest's LAT_MEASURE_TAIL: the largest samples
// dropped before computing the statistics.
const latMeasureTail = 2

// LatencyStats is what perftest's print_report_lat computes, in
// microseconds.
type LatencyStats struct {
	Samples int     // samples used (after dropping the 2 largest)
	Min     float64 // t_min
	Max     float64 // t_max: the largest sample kept
	Typical float64 // t_typical: the median of the kept samples
	Avg     float64 // t_avg
	Stdev   float64 // t_stdev (population standard deviation)
	P99     float64 // 99% percentile
	P999    float64 // 99.9% percentile
}

// RTTFactor is the divisor perftest applies to each latency sample: 2 for
// send and write tests (a sample is a full ping-pong, reported as one way),
// 1 for read and atomic tests (a sample is one request/response).
func (t Test) RTTFactor() int {
	if t.Verb == VerbRead || t.Verb == VerbAtomic {
		return 1
	}
	return 2
}

// ComputeLatency does what print_report_lat does with the per-iteration
// samples of a latency run (perftest takes the differences of consecutive
// post timestamps: iters-1 samples for iters iterations): sort, drop the two
// largest, and over the rest take the minimum, the largest kept, the median
// (mean of the two middle ones, in whole nanoseconds, for an even count),
// the mean, the population standard deviation and the samples at
// ceil(n*0.99) and ceil(n*0.999) of the sorted array (which may reach the
// first dropped one, as in perftest). Each value is divided by rttFactor
// (Test.RTTFactor). At least 3 samples are needed. samples is not modified.
func ComputeLatency(samples []time.Duration, rttFactor int) (LatencyStats, error) {
	if rttFactor < 1 {
		return LatencyStats{}, fmt.Errorf("oob: RTT factor %d < 1", rttFactor)
	}
	if len(samples) <= latMeasureTail {
		return LatencyStats{}, fmt.Errorf("oob: %d latency samples, need at least %d", len(samples), latMeasureTail+1)
	}
	delta := slices.Clone(samples)
	slices.Sort(delta)
	n := len(delta) - latMeasureTail
	var median time.Duration
	if (n-1)%2 != 0 {
		median = (delta[n/2] + delta[n/2-1]) / 2
	} else {
		median = delta[n/2]
	}
	q := float64(time.Microsecond) * float64(rttFactor)
	usec := func(d time.Duration) float64 { return float64(d) / q }
	var sum float64
	for _, d := range delta[:n] {
		sum += usec(d)
	}
	avg := sum / float64(n)
	var varSum float64
	for _, d := range delta[:n] {
		t := avg - usec(d)
		varSum += t * t
	}
	i99 := int(math.Ceil(float64(n) * 0.99))
	i999 := int(math.Ceil(float64(n) * 0.999))
	return LatencyStats{
		Samples: n,
		Min:     usec(delta[0]),
		Max:     usec(delta[n]),
		Typical: usec(median),
		Avg:     avg,
		Stdev:   math.Sqrt(varSum / float64(n)),
		P99:     usec(delta[i99]),
		P999:    usec(delta[i999]),
	}, nil
}
