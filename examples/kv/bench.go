package kv

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"text/tabwriter"
	"time"
)

// BenchConfig describes a benchmark run: every combination of client
// count and GET share, over RDMA then TCP, against one server.
type BenchConfig struct {
	Clients     []int // client counts (1, 4, 16)
	GetPercents []int // GET share of the operations (100, 90); the rest are PUTs
	// Duration is how long each cell runs (Ops, if set, is per client instead).
	Duration time.Duration
	Ops      int
	Keys     int // keys preloaded and accessed uniformly
	ValueLen int // value size
	Seed     uint64

	// Transports are dialers by name, measured in this order ("rdma", "tcp").
	Transports []BenchTransport
	// ServerStats returns the server application's counters (both handlers).
	ServerStats func(ctx context.Context) (rdma, tcp HandlerStats, err error)
	// ServerCPU, if set, is the server process's CPU time so far (engine and
	// application; only meaningful when the server runs in its own process).
	ServerCPU func() (time.Duration, error)
	// ClientCPU, if set, is this process's CPU time so far.
	ClientCPU func() (time.Duration, error)
	// HandlerCPU says the server measures its handlers' CPU
	// (App.MeasureHandlerCPU); without it the handler CPU columns are
	// not measured (-1, printed as -).
	HandlerCPU bool
}

// BenchTransport is one way to reach the server.
type BenchTransport struct {
	Name string
	Dial func(ctx context.Context) (Client, error)
}

// BenchResult is one measured cell.
type BenchResult struct {
	Transport      string
	Clients        int
	GetPercent     int
	Gets, Puts     uint64
	Elapsed        time.Duration
	P50, P99       time.Duration // GET latency
	GetsPerSec     float64
	OpsPerSec      float64
	AppCallsPerGet float64       // server application handler invocations per GET
	AppCPUPerOp    time.Duration // server application handler CPU per operation (-1: not measured)
	AppCPUPerGet   time.Duration // handler CPU spent on GETs, per GET (0 when no handler ran for GETs; -1: not measured)
	ServerCPUPerOp time.Duration // server process CPU per operation (-1: not measured)
	ClientCPUPerOp time.Duration // client process CPU per operation (-1: not measured)
	CopiedPerGet   float64       // user-space bytes copied per GET (client and server application)
	WirePerGet     float64       // response payload bytes per GET (READ data, or TCP response)
	Retries        uint64
}

// Bench preloads the keys over the first transport, then measures every
// cell. Results come in the order clients x percent x transport.
func Bench(ctx context.Context, cfg BenchConfig) ([]BenchResult, error) {
	if len(cfg.Transports) == 0 {
		return nil, fmt.Errorf("kv bench: no transports")
	}
	loader, err := cfg.Transports[0].Dial(ctx)
	if err != nil {
		return nil, err
	}
	for k := range cfg.Keys {
		if err := loader.Put(ctx, benchKey(k), benchValue(k, 0, cfg.ValueLen)); err != nil {
			loader.Close()
			return nil, fmt.Errorf("kv bench: preloading key %d: %w", k, err)
		}
	}
	loader.Close()
	var out []BenchResult
	for _, nc := range cfg.Clients {
		for _, pct := range cfg.GetPercents {
			for _, tr := range cfg.Transports {
				r, err := benchCell(ctx, cfg, tr, nc, pct)
				if err != nil {
					return out, fmt.Errorf("kv bench: %s, %d clients, %d%% GET: %w", tr.Name, nc, pct, err)
				}
				out = append(out, r)
			}
		}
	}
	return out, nil
}

func benchKey(k int) []byte { return fmt.Appendf(nil, "bench-%08d", k) }

func benchValue(k, gen, n int) []byte {
	v := make([]byte, n)
	for i := range v {
		v[i] = byte(k + gen + i)
	}
	return v
}

func benchCell(ctx context.Context, cfg BenchConfig, tr BenchTransport, nc, pct int) (BenchResult, error) {
	r := BenchResult{Transport: tr.Name, Clients: nc, GetPercent: pct, ServerCPUPerOp: -1, ClientCPUPerOp: -1}
	var clients []Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for range nc {
		c, err := tr.Dial(ctx)
		if err != nil {
			return r, err
		}
		clients = append(clients, c)
	}
	rs0, ts0, err := cfg.ServerStats(ctx)
	if err != nil {
		return r, err
	}
	var scpu0, ccpu0 time.Duration
	if cfg.ServerCPU != nil {
		scpu0, _ = cfg.ServerCPU()
	}
	if cfg.ClientCPU != nil {
		ccpu0, _ = cfg.ClientCPU()
	}
	before := make([]ClientStats, nc)
	for i, c := range clients {
		before[i] = c.Stats()
	}
	lat := make([][]time.Duration, nc)
	errs := make([]error, nc)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)))
			l := make([]time.Duration, 0, 1<<14)
			for n := 0; ; n++ {
				if cfg.Ops > 0 && n >= cfg.Ops || cfg.Ops == 0 && n%16 == 0 && time.Now().After(deadline) {
					break
				}
				k := rng.IntN(cfg.Keys)
				if rng.IntN(100) < pct {
					t0 := time.Now()
					if _, err := c.Get(ctx, benchKey(k)); err != nil {
						errs[i] = err
						break
					}
					l = append(l, time.Since(t0))
					continue
				}
				if err := c.Put(ctx, benchKey(k), benchValue(k, n, cfg.ValueLen)); err != nil {
					errs[i] = err
					break
				}
			}
			lat[i] = l
		}()
	}
	wg.Wait()
	r.Elapsed = time.Since(start)
	for _, err := range errs {
		if err != nil {
			return r, err
		}
	}
	rs1, ts1, err := cfg.ServerStats(ctx)
	if err != nil {
		return r, err
	}
	var app HandlerStats
	switch tr.Name {
	case "rdma":
		app = rs1.Sub(rs0)
	default:
		app = ts1.Sub(ts0)
	}
	var st ClientStats
	for i, c := range clients {
		s := c.Stats()
		st.Gets += s.Gets - before[i].Gets
		st.Puts += s.Puts - before[i].Puts
		st.BytesRead += s.BytesRead - before[i].BytesRead
		st.BytesCopiedOut += s.BytesCopiedOut - before[i].BytesCopiedOut
		st.RetryWriting += s.RetryWriting - before[i].RetryWriting
		st.RetryTorn += s.RetryTorn - before[i].RetryTorn
		st.RetryStale += s.RetryStale - before[i].RetryStale
	}
	r.Gets, r.Puts, r.Retries = st.Gets, st.Puts, st.Retries()
	ops := float64(st.Gets + st.Puts)
	secs := r.Elapsed.Seconds()
	r.GetsPerSec, r.OpsPerSec = float64(st.Gets)/secs, ops/secs
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) > 0 {
		r.P50 = all[len(all)/2]
		r.P99 = all[min(len(all)-1, len(all)*99/100)]
	}
	if st.Gets > 0 {
		g := float64(st.Gets)
		r.AppCallsPerGet = float64(app.Gets) / g
		// Over RDMA the engine places the READ data (BytesRead) and the
		// client copies the value out; over TCP the server's handler copies
		// the value into its response and the client copies it out of
		// its reader. Kernel copies (one each way per message) are the same
		// for both designs and not counted.
		copied := float64(st.BytesCopiedOut + app.BytesCopied - app.Puts*uint64(cfg.ValueLen))
		if tr.Name == "rdma" {
			copied += float64(st.BytesRead)
		}
		r.CopiedPerGet = copied / g
		r.WirePerGet = float64(st.BytesRead) / g
	}
	r.AppCPUPerGet, r.AppCPUPerOp = appCPU(cfg.HandlerCPU, app, ops)
	if ops > 0 {
		if cfg.ServerCPU != nil {
			if c, err := cfg.ServerCPU(); err == nil {
				r.ServerCPUPerOp = time.Duration(float64(c-scpu0) / ops)
			}
		}
		if cfg.ClientCPU != nil {
			if c, err := cfg.ClientCPU(); err == nil {
				r.ClientCPUPerOp = time.Duration(float64(c-ccpu0) / ops)
			}
		}
	}
	return r, nil
}

// WriteBenchTable prints the results, then the RDMA/TCP ratios of each
// cell measured in this run.
func WriteBenchTable(w io.Writer, rs []BenchResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "transport\tclients\tGET%\tGET/s\top/s\tp50 us\tp99 us\tapp calls/GET\tapp CPU/GET ns\tapp CPU/op ns\tserver CPU/op us\tclient CPU/op us\tcopied B/GET\twire B/GET\tretries\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.0f\t%.1f\t%.1f\t%.2f\t%s\t%s\t%s\t%s\t%.0f\t%.0f\t%d\t\n",
			r.Transport, r.Clients, r.GetPercent, r.GetsPerSec, r.OpsPerSec, us(r.P50), us(r.P99), r.AppCallsPerGet,
			cpuNS(r.AppCPUPerGet), cpuNS(r.AppCPUPerOp), cpuUS(r.ServerCPUPerOp), cpuUS(r.ClientCPUPerOp),
			r.CopiedPerGet, r.WirePerGet, r.Retries)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rdma/tcp\tclients\tGET%\tGET/s\tp50\tp99\tserver CPU/op\t")
	for i, r := range rs {
		if r.Transport != "rdma" {
			continue
		}
		for _, t := range rs[i+1:] {
			if t.Transport == "tcp" && t.Clients == r.Clients && t.GetPercent == r.GetPercent {
				fmt.Fprintf(tw, "\t%d\t%d\t%s\t%s\t%s\t%s\t\n", r.Clients, r.GetPercent, ratio(r.GetsPerSec, t.GetsPerSec),
					ratio(us(r.P50), us(t.P50)), ratio(us(r.P99), us(t.P99)),
					ratio(float64(r.ServerCPUPerOp), float64(t.ServerCPUPerOp)))
				break
			}
		}
	}
	tw.Flush()
}

// appCPU is the handlers' CPU per GET and per operation (-1 each when
// not measured): per GET only if a handler ran for GETs, and then its
// CPU per call, since a handler does not split its CPU by kind.
func appCPU(measured bool, app HandlerStats, ops float64) (perGet, perOp time.Duration) {
	if !measured {
		return -1, -1
	}
	if app.Gets > 0 {
		perGet = time.Duration(app.CPUNanos / app.Calls())
	}
	if ops > 0 {
		perOp = time.Duration(float64(app.CPUNanos) / ops)
	}
	return perGet, perOp
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

func cpuNS(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%d", d.Nanoseconds())
}

func cpuUS(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", us(d))
}

func ratio(a, b float64) string {
	if a < 0 || b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}
