package allreduce

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/rxed/rxed/pkg/ib"
)

// Member is one rank's ring, whichever transport.
type Member interface {
	Data() []float32
	AllReduce(ctx context.Context) error
	Close() error
}

// Join connects every rank of an in-process ring at once (dial is one
// rank's DialRDMA or DialTCP) and returns the members in rank order.
func Join(ctx context.Context, n int, dial func(ctx context.Context, rank int) (Member, error)) ([]Member, error) {
	ms := make([]Member, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ms[i], errs[i] = dial(ctx, i)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, m := range ms {
			if m != nil {
				m.Close()
			}
		}
		return nil, err
	}
	return ms, nil
}

// Run fills every member with Input, runs one allreduce on all of them
// concurrently and returns its wall time and every rank's error.
func Run(ctx context.Context, ms []Member) (time.Duration, []error) {
	for i, m := range ms {
		copy(m.Data(), Input(i, len(m.Data())))
	}
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	start := time.Now()
	for i, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.AllReduce(ctx)
		}()
	}
	wg.Wait()
	return time.Since(start), errs
}

// Check compares every member's vector with the reference sum of the
// inputs and returns the number of wrong elements (over all ranks).
func Check(ms []Member) int {
	inputs := make([][]float32, len(ms))
	for i, m := range ms {
		inputs[i] = Input(i, len(m.Data()))
	}
	want := Reference(inputs)
	wrong := 0
	for _, m := range ms {
		wrong += Mismatches(m.Data(), want)
	}
	return wrong
}

// RDMARank is a Member over RDMA together with the device it owns.
type RDMARank struct {
	*Ring
	Dev *ib.Device
}

// Close leaves the ring and closes the device.
func (r *RDMARank) Close() error {
	r.Ring.Close()
	return r.Dev.Close()
}

// CMAddr is rank i's rdma_cm address in an address plan base, base+1, ...
func CMAddr(base netip.Addr, i int, port uint16) netip.AddrPort {
	a := base
	for range i {
		a = a.Next()
	}
	return netip.AddrPortFrom(a, port)
}

// Result is one line of the nccl-tests style table.
type Result struct {
	Bytes  int
	Time   time.Duration // per allreduce (mean over iterations)
	AlgBW  float64       // GB/s: bytes / time
	BusBW  float64       // GB/s: AlgBW * 2(n-1)/n
	Wrong  int
	Spread time.Duration // max - min over the iterations
	Iters  int
	Failed error
	// CPU is the process's CPU time (user + system) per timed allreduce,
	// when MeasureRank was given a clock for it.
	CPU time.Duration
}

// Measure runs iters timed allreduces (after one warm-up) on ms and checks
// the last result bit for bit.
func Measure(ctx context.Context, ms []Member, iters int) Result {
	n := len(ms)
	r := Result{Bytes: len(ms[0].Data()) * 4, Iters: iters}
	if _, errs := Run(ctx, ms); errors.Join(errs...) != nil {
		r.Failed = errors.Join(errs...)
		return r
	}
	var total, lo, hi time.Duration
	for i := range iters {
		d, errs := Run(ctx, ms)
		if err := errors.Join(errs...); err != nil {
			r.Failed = err
			return r
		}
		total += d
		if i == 0 || d < lo {
			lo = d
		}
		hi = max(hi, d)
	}
	r.Time = total / time.Duration(iters)
	r.Spread = hi - lo
	r.AlgBW = float64(r.Bytes) / r.Time.Seconds() / 1e9
	r.BusBW = r.AlgBW * 2 * float64(n-1) / float64(n)
	r.Wrong = Check(ms)
	return r
}

// FormatHeader is nccl-tests' header with one column group per transport.
func FormatHeader(transports ...string) string {
	s := fmt.Sprintf("#%12s %12s %8s %6s %6s", "size", "count", "type", "redop", "root")
	u := fmt.Sprintf("#%12s %12s %8s %6s %6s", "(B)", "(elements)", "", "", "")
	for _, t := range transports {
		s += fmt.Sprintf("  %9s %7s %7s %6s", t+" time", "algbw", "busbw", "#wrong")
		u += fmt.Sprintf("  %9s %7s %7s %6s", "(us)", "(GB/s)", "(GB/s)", "")
	}
	return s + "\n" + u + "\n"
}

// FormatLine prints one size's results, one group per transport.
func FormatLine(bytes int, rs ...Result) string {
	s := fmt.Sprintf(" %12d %12d %8s %6s %6d", bytes, bytes/4, "float", "sum", -1)
	for _, r := range rs {
		if r.Failed != nil {
			s += fmt.Sprintf("  %9s %7s %7s %6s", "failed", "-", "-", "-")
			continue
		}
		s += fmt.Sprintf("  %9.1f %7.3f %7.3f %6d", float64(r.Time)/1e3, r.AlgBW, r.BusBW, r.Wrong)
	}
	return s + "\n"
}

// MeasureRank is Measure for one rank of a ring whose other ranks run
// elsewhere (other processes) and call MeasureRank with the same iters:
// each allreduce is timed as this rank sees it (the ring synchronises the
// ranks: no rank finishes before every rank has started), and this rank's
// last result is checked bit for bit with CheckRank. cpu, if not nil, is
// the process's CPU time so far; Result.CPU is then its increase per timed
// allreduce (the copy of the input in, not the check).
func MeasureRank(ctx context.Context, m Member, rank, ranks, iters int, cpu func() (time.Duration, error)) Result {
	r := Result{Bytes: len(m.Data()) * 4, Iters: iters}
	in := Input(rank, len(m.Data()))
	var total, lo, hi, cpu0 time.Duration
	for i := range iters + 1 { // the first is the warm-up
		copy(m.Data(), in)
		start := time.Now()
		if err := m.AllReduce(ctx); err != nil {
			r.Failed = err
			return r
		}
		d := time.Since(start)
		if i == 0 {
			if cpu != nil {
				cpu0, _ = cpu()
			}
			continue
		}
		total += d
		if i == 1 || d < lo {
			lo = d
		}
		hi = max(hi, d)
	}
	if cpu != nil {
		if c, err := cpu(); err == nil {
			r.CPU = (c - cpu0) / time.Duration(iters)
		}
	}
	r.Time = total / time.Duration(iters)
	r.Spread = hi - lo
	r.AlgBW = float64(r.Bytes) / r.Time.Seconds() / 1e9
	r.BusBW = r.AlgBW * 2 * float64(ranks-1) / float64(ranks)
	r.Wrong = CheckRank(m.Data(), ranks)
	return r
}
