package oob

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func usecs(v ...float64) []time.Duration {
	d := make([]time.Duration, len(v))
	for i, x := range v {
		d[i] = time.Duration(x * float64(time.Microsecond))
	}
	return d
}

func TestComputeLatency(t *testing.T) {
	samples := usecs(5, 3, 9, 1, 7, 2, 8, 100, 4, 6)
	orig := append([]time.Duration(nil), samples...)
	st, err := ComputeLatency(samples, 1)
	require.NoError(t, err)
	require.Equal(t, orig, samples, "input must not be modified")
	// Sorted 1..9,100; the two largest (9, 100) are dropped from the
	// statistics but t_max and the percentiles index the sorted array at
	// n and ceil(n*0.99), as perftest does.
	require.Equal(t, 8, st.Samples)
	require.InDelta(t, 1.0, st.Min, 1e-12)
	require.InDelta(t, 9.0, st.Max, 1e-12)
	require.InDelta(t, 4.5, st.Typical, 1e-12)
	require.InDelta(t, 4.5, st.Avg, 1e-12)
	require.InDelta(t, math.Sqrt(5.25), st.Stdev, 1e-12)
	require.InDelta(t, 9.0, st.P99, 1e-12)
	require.InDelta(t, 9.0, st.P999, 1e-12)

	half, err := ComputeLatency(samples, 2)
	require.NoError(t, err)
	require.InDelta(t, 2.25, half.Typical, 1e-12)
	require.InDelta(t, 4.5, half.Max, 1e-12)

	// Odd count of kept samples: the middle one.
	st, err = ComputeLatency(usecs(1, 2, 3, 50, 60), 1)
	require.NoError(t, err)
	require.Equal(t, 3, st.Samples)
	require.InDelta(t, 2.0, st.Typical, 1e-12)
	require.InDelta(t, 50.0, st.Max, 1e-12)

	// Median of an even count is a whole number of nanoseconds, like
	// perftest's integer cycles.
	st, err = ComputeLatency([]time.Duration{1, 2, 10, 10}, 1)
	require.NoError(t, err)
	require.InDelta(t, 0.001, st.Typical, 1e-15)

	_, err = ComputeLatency(usecs(1, 2), 1)
	require.Error(t, err)
	_, err = ComputeLatency(usecs(1, 2, 3), 0)
	require.Error(t, err)

	require.Equal(t, 2, Test{Verb: VerbSend, Latency: true}.RTTFactor())
	require.Equal(t, 2, Test{Verb: VerbWrite, Latency: true}.RTTFactor())
	require.Equal(t, 1, Test{Verb: VerbRead, Latency: true}.RTTFactor())
	require.Equal(t, 1, Test{Verb: VerbAtomic, Latency: true}.RTTFactor())
}

func TestWriteLatencyRows(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, WriteLatencyHeader(&b, false))
	require.NoError(t, WriteLatencyResult(&b, 2, 10, LatencyStats{Min: 257.80, Max: 958.52, Typical: 365.74, Avg: 390.25, Stdev: 114.73, P99: 958.52, P999: 958.52}))
	require.NoError(t, WriteLatencyHeader(&b, true))
	require.NoError(t, WriteLatencyDurationResult(&b, 2, 12345, 3.14159, 158000.5))
	require.Equal(t, ResultLine+
		" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n"+
		" 2       10          257.80         958.52       365.74   \t       390.25      \t114.73 \t\t958.52  \t\t958.52 \n"+
		ResultLine+
		" #bytes        #iterations       t_avg[usec]    tps average\n"+
		" 2             12345            3.14           158000.50\n", b.String())
}

func TestComputeBW(t *testing.T) {
	ms := func(v ...float64) []time.Duration {
		d := make([]time.Duration, len(v))
		for i, x := range v {
			d[i] = time.Duration(x * float64(time.Millisecond))
		}
		return d
	}
	in := BWSamples{Size: 1 << 20, Posted: ms(0, 1, 2, 4), Completed: ms(5, 5, 6, 6), CQMod: 2}
	r, err := ComputeBW(in)
	require.NoError(t, err)
	// Best window: iterations 0..3 in 6 ms -> 1.5 ms per MiB.
	require.Equal(t, uint64(1<<20), r.Size)
	require.Equal(t, uint64(4), r.Iters)
	require.InDelta(t, 1000.0/1.5, r.BWPeak, 1e-9)
	require.InDelta(t, 4000.0/6, r.BWAvg, 1e-9)
	require.InDelta(t, 4.0/6000, r.MsgRateAvg, 1e-15)

	in.Gbits = true
	r, err = ComputeBW(in)
	require.NoError(t, err)
	require.InDelta(t, float64(1<<20)*8/1.5e6, r.BWPeak, 1e-9)

	// A faster window in the middle raises the peak above the average;
	// CQMod 3 with 4 iterations exercises the signalled last iteration.
	in = BWSamples{Size: 1000, Posted: ms(0, 1, 2, 3), Completed: ms(10, 10, 10, 11), CQMod: 3}
	r, err = ComputeBW(in)
	require.NoError(t, err)
	// i=3, j=3: (11-3)/1 = 8 ms; i=0, j=2: 10/3 ms; i=0, j=3: 11/4 ms.
	require.InDelta(t, 1000*1e9/(2.75e6*0x100000), r.BWPeak, 1e-9)
	require.InDelta(t, 4*1000*1e9/(11e6*0x100000), r.BWAvg, 1e-12)

	in.NoPeak = true
	in.Completed = ms(11, 0, 0, 0)
	r, err = ComputeBW(in)
	require.NoError(t, err)
	require.Zero(t, r.BWPeak)
	require.InDelta(t, 4*1000*1e9/(11e6*0x100000), r.BWAvg, 1e-12)

	_, err = ComputeBW(BWSamples{Posted: ms(0), Completed: ms()})
	require.Error(t, err)
	_, err = ComputeBW(BWSamples{Posted: ms(1), Completed: ms(1)})
	require.Error(t, err)
}

func TestWriteBWRows(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, WriteBWHeader(&b, false))
	require.NoError(t, WriteBWResult(&b, BWReport{Size: 4096, Iters: 10, BWPeak: 4.7272, BWAvg: 4.7184, MsgRateAvg: 0.0012079}, nil, false))
	require.NoError(t, WriteBWHeader(&b, true))
	require.NoError(t, WriteBWResult(&b, BWReport{Size: 65536, Iters: 1000, BWPeak: 9.5, BWAvg: 9.25, MsgRateAvg: 0.0176}, nil, true))
	// Gb/sec below 0.1: six decimals (REPORT_FMT_EXT).
	require.NoError(t, WriteBWResult(&b, BWReport{Size: 8, Iters: 10, BWPeak: 0.01, BWAvg: 0.009, MsgRateAvg: 0.1}, nil, true))
	// Bidirectional: figures summed.
	require.NoError(t, WriteBWResult(&b, BWReport{Size: 8, Iters: 10, BWPeak: 1, BWAvg: 2, MsgRateAvg: 3}, &BWReport{BWPeak: 1, BWAvg: 2, MsgRateAvg: 3}, false))
	require.Equal(t, ResultLine+
		" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"+
		" 4096       10               4.73               4.72   \t\t   0.001208\n"+
		ResultLine+
		" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"+
		" 65536      1000             9.50               9.25   \t\t   0.017600\n"+
		" 8          10           0.010000            0.009000            0.100000\n"+
		" 8          10               2.00               4.00   \t\t   6.000000\n", b.String())
}

// AverageBW is print_report_bw's average (the bandwidth stream tests and
// rxed perf tcp report it): MB/s of 2^20 bytes or Gb/s, messages in
// millions per second, no peak.
func TestAverageBWIsPerftestsAverage(t *testing.T) {
	r := AverageBW(65536, 1000, time.Second/10, false)
	require.InDelta(t, 65536.0*1000*10/(1<<20), r.BWAvg, 1e-9) // 625 MB/s
	require.InDelta(t, 0.01, r.MsgRateAvg, 1e-12)              // 10,000 messages/s
	require.Zero(t, r.BWPeak)
	require.Equal(t, BWReport{Size: 65536, Iters: 1000, BWAvg: r.BWAvg, MsgRateAvg: r.MsgRateAvg}, r)
	g := AverageBW(65536, 1000, time.Second/10, true)
	require.InDelta(t, 65536.0*1000*10*8/1e9, g.BWAvg, 1e-9)
	require.Positive(t, AverageBW(1, 1, 0, false).BWAvg, "a run of no measurable duration counts as 1 ns")
}
