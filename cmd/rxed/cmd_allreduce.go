package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/rxed/rxed/examples/allreduce"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
)

func init() {
	register(&command{
		name:    "allreduce",
		summary: "ring allreduce of float32 vectors over RDMA WRITE with immediate and over TCP, N ranks in one process or one rank (--rank, --peers) per process; nccl-tests output",
		run:     runAllreduce,
	})
}

type allreduceOpts struct {
	ranks    []int
	minBytes int
	maxBytes int
	iters    int
	net      string
	base     netip.Addr
	tcpBase  int
	cmPort   int
	timeout  time.Duration
	spin     time.Duration // --spin, the tools' meaning (waiterSpin)
	// One rank per process: rank >= 0 and the peers' addresses.
	rank    int
	peers   []netip.Addr
	verbose bool
	cpus    int    // --cpus (0: automatic, chooseProcs)
	procs   string // the GOMAXPROCS the process runs with and why, for the header
}

func runAllreduce(args []string, stdout, stderr io.Writer) int {
	o := &allreduceOpts{}
	fs := flag.NewFlagSet("allreduce", flag.ContinueOnError)
	ranks := fs.String("ranks", "2,4,8", "rank `counts` to run")
	var minB, maxB sizeFlag
	sizeVar(fs, &minB, "b", 4<<10, "smallest `size` (bytes; K, M, G suffixes)")
	sizeVar(fs, &maxB, "e", 64<<20, "largest `size` (bytes; K, M, G suffixes)")
	fs.IntVar(&o.iters, "n", 5, "timed `iterations` per size (after one warm-up)")
	fs.StringVar(&o.net, "net", "udp", "`mem` (in-memory network) or udp (one engine per rank on 127.0.1.x loopback)")
	base := fs.String("addr", "127.0.1.1", "first rank's `address` (rank i uses the i-th next one)")
	fs.IntVar(&o.tcpBase, "tcp-port", 17600, "TCP ring: rank i listens on this `port` + i")
	fs.IntVar(&o.cmPort, "cm-port", 7600, "rdma_cm `port` every rank listens on")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "connection setup and per-step deadline")
	o.spin = defaultSpin
	fs.Var((*spinFlag)(&o.spin), "spin", "RDMA ranks busy-poll their CQ this long before sleeping until a chunk arrives (`duration`; -1: never sleep; 0: sleep at once; the budget adapts up to 4 times this; with --rank the default is 0 when the ring has more ranks than this host has CPUs)")
	fs.IntVar(&o.rank, "rank", -1, "run only this `rank` (0-based) in this process, the others run in theirs (needs --peers)")
	fs.BoolVar(&o.verbose, "v", false, "with --rank: a comment line each time a ring is joined")
	fs.IntVar(&o.cpus, "cpus", 0, "CPUs the Go runtime uses (GOMAXPROCS; default: all, or with --rank this host's CPUs divided by the rank count when every --peers address is a loopback address)")
	peers := fs.String("peers", "", "every rank's IPv4 `addresses`, comma-separated, in rank order (with --rank): rank i's engine (UDP 4791), rdma_cm (--cm-port) and TCP (--tcp-port) listen on the i-th")
	rest, code, ok := parseArgs(fs, args, stderr)
	if !ok {
		return code
	}
	ranksSet, spinSet := false, false
	fs.Visit(func(f *flag.Flag) {
		ranksSet = ranksSet || f.Name == "ranks"
		spinSet = spinSet || f.Name == "spin"
	})
	// Usage errors exit 2, as every command's; a failed run exits 1.
	usage := func(err error) int {
		fail(stderr, "allreduce", err)
		return 2
	}
	if len(rest) > 0 {
		// It was ignored, and the run went ahead without what it meant
		// (a rank's address, say).
		return usage(fmt.Errorf("unexpected argument %q (allreduce takes flags only: --peers for the other ranks' addresses)", rest[0]))
	}
	var err error
	if o.ranks, err = parseIntList(*ranks); err != nil {
		return usage(fmt.Errorf("--ranks: %v", err))
	}
	for _, n := range o.ranks {
		if n < 2 {
			return usage(fmt.Errorf("--ranks: %d ranks (at least 2)", n))
		}
	}
	if minB == 0 || minB > 1<<40 {
		return usage(fmt.Errorf("-b %d: want a positive size", minB))
	}
	if maxB < minB || maxB > 1<<40 {
		return usage(fmt.Errorf("-e %d: a size at least -b", maxB))
	}
	o.minBytes, o.maxBytes = int(minB), int(maxB)
	if o.base, err = netip.ParseAddr(*base); err != nil || !o.base.Is4() {
		return usage(fmt.Errorf("--addr %q: not an IPv4 address", *base))
	}
	if o.net != "mem" && o.net != "udp" {
		return usage(fmt.Errorf("--net %q: mem or udp", o.net))
	}
	if o.iters < 1 {
		return usage(fmt.Errorf("-n %d: at least 1", o.iters))
	}
	if o.cpus < 0 {
		return usage(fmt.Errorf("--cpus %d: want a positive count (0 or absent: automatic)", o.cpus))
	}
	if o.rank >= 0 || *peers != "" {
		if err := o.parsePeers(*peers, ranksSet); err != nil {
			return usage(err)
		}
		if !spinSet {
			o.spin = rankProcessSpin(len(o.peers), runtime.NumCPU())
		}
	}
	o.procs = applyAllreduceProcs(o.cpus, os.Getenv("GOMAXPROCS"), o.peers)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if o.peers != nil {
		if err := o.runRank(ctx, stdout); err != nil {
			return failHint(stderr, "allreduce", err, allreduceNextStep(err, true))
		}
		return 0
	}
	failed := false
	for _, n := range o.ranks {
		fmt.Fprintf(stdout, "# ring allreduce, %d ranks in one process (%s), %s per size, %s, %s, load %s\n", n, o.net, iterations(o.iters), rankWaitDescr(o.spin), o.procs, loadAvg())
		fmt.Fprint(stdout, allreduce.FormatHeader("rdma", "tcp"))
		for size := o.minBytes; size <= o.maxBytes; size *= 2 {
			count := size / 4
			if count < n {
				continue
			}
			var rs []allreduce.Result
			for _, tr := range []string{"rdma", "tcp"} {
				r, err := o.measure(ctx, tr, n, count)
				if err != nil {
					r.Failed = err
				}
				if r.Failed != nil {
					failHint(stderr, "allreduce", fmt.Errorf("%s, %d ranks, %d bytes: %w", tr, n, size, r.Failed), allreduceNextStep(r.Failed, false))
					failed = true
				}
				if r.Wrong != 0 {
					failed = true
				}
				rs = append(rs, r)
			}
			fmt.Fprint(stdout, allreduce.FormatLine(size, rs...))
		}
		fmt.Fprintf(stdout, "# load after: %s\n", loadAvg())
	}
	if failed {
		return 1
	}
	return 0
}

// measure joins an n-rank ring over one transport, measures one size and
// leaves the ring.
func (o *allreduceOpts) measure(ctx context.Context, tr string, n, count int) (allreduce.Result, error) {
	cfgOf := func(i int) allreduce.Config {
		return allreduce.Config{Rank: i, Ranks: n, Count: count, Timeout: o.timeout, Spin: waiterSpin(o.spin)}
	}
	var dial func(ctx context.Context, i int) (allreduce.Member, error)
	if tr == "tcp" {
		// Rank i's own address (udp) or 127.0.0.1 (mem: the rank
		// addresses exist only in the in-memory network).
		addr := func(i int) string {
			a := allreduce.CMAddr(o.base, i, uint16(o.tcpBase+i))
			if o.net == "mem" {
				a = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), a.Port())
			}
			return a.String()
		}
		dial = func(ctx context.Context, i int) (allreduce.Member, error) {
			r, err := allreduce.DialTCP(ctx, cfgOf(i), allreduce.TCPConfig{Listen: addr(i), Next: addr((i + 1) % n)})
			if err != nil {
				return nil, err
			}
			return r, nil
		}
	} else {
		devs, err := o.openDevices(n)
		if err != nil {
			return allreduce.Result{}, err
		}
		dial = func(ctx context.Context, i int) (allreduce.Member, error) {
			r, err := allreduce.DialRDMA(ctx, devs[i], cfgOf(i), allreduce.RDMAConfig{
				Listen: allreduce.CMAddr(o.base, i, uint16(o.cmPort)), Next: allreduce.CMAddr(o.base, (i+1)%n, uint16(o.cmPort))})
			if err != nil {
				devs[i].Close()
				return nil, err
			}
			return &allreduce.RDMARank{Ring: r, Dev: devs[i]}, nil
		}
	}
	ms, err := allreduce.Join(ctx, n, dial)
	if err != nil {
		return allreduce.Result{}, err
	}
	defer func() {
		for _, m := range ms {
			m.Close()
		}
	}()
	return allreduce.Measure(ctx, ms, o.iters), nil
}

// openDevices opens one engine per rank, every one up before any dials.
func (o *allreduceOpts) openDevices(n int) ([]*ib.Device, error) {
	var mem *transport.MemNetwork
	if o.net == "mem" {
		mem = transport.NewMemNetwork()
	}
	devs := make([]*ib.Device, 0, n)
	for i := range n {
		a := allreduce.CMAddr(o.base, i, transport.RoCEv2Port)
		cfg := ib.Config{Addrs: []netip.Addr{a.Addr()}, Workers: 1}
		if mem != nil {
			c, err := mem.Listen(a)
			if err != nil {
				return nil, err
			}
			cfg = ib.Config{Conn: c, Workers: 1}
		}
		dev, err := ib.OpenDevice(cfg)
		if err == nil {
			err = rdmacm.Enable(dev, nil)
		}
		if err != nil {
			for _, d := range devs {
				d.Close()
			}
			return nil, engineOpenError(fmt.Sprintf("rank %d's RoCE engine", i), a.Addr().String(), uint(a.Port()), err)
		}
		devs = append(devs, dev)
	}
	return devs, nil
}

// parsePeers checks the one-rank-per-process flags: the rank count is the
// number of peers (--ranks, if given, must say the same).
func (o *allreduceOpts) parsePeers(peers string, ranksSet bool) error {
	if peers == "" {
		return errors.New("--rank needs --peers (every rank's address in rank order)")
	}
	if o.rank < 0 {
		return errors.New("--peers needs --rank (which of them this process is)")
	}
	seen := map[netip.Addr]bool{}
	for _, f := range strings.Split(peers, ",") {
		a, err := netip.ParseAddr(strings.TrimSpace(f))
		if err != nil || !a.Is4() {
			return fmt.Errorf("--peers: %q is not an IPv4 address", f)
		}
		if seen[a] {
			return fmt.Errorf("--peers: %v appears twice (one address per rank)", a)
		}
		seen[a] = true
		o.peers = append(o.peers, a)
	}
	n := len(o.peers)
	switch {
	case n < 2:
		return fmt.Errorf("--peers: %d address (at least 2 ranks)", n)
	case o.rank >= n:
		return fmt.Errorf("--rank %d: only %d peers (ranks 0..%d)", o.rank, n, n-1)
	case ranksSet && (len(o.ranks) != 1 || o.ranks[0] != n):
		return fmt.Errorf("--ranks %v but %d peers (with --rank the rank count is the number of peers)", o.ranks, n)
	case o.net != "udp":
		return errors.New("--rank runs over udp only (the in-memory network does not span processes)")
	}
	return nil
}

// runRank is one rank of a ring whose other ranks are other processes:
// for every size it joins the RDMA ring then the TCP ring, runs the warm-up
// and the timed iterations, checks its own result and leaves. The first
// failure ends the run: its neighbours see it (a disconnect, or nothing
// within --timeout) and fail in turn.
func (o *allreduceOpts) runRank(ctx context.Context, stdout io.Writer) error {
	n, me := len(o.peers), o.rank
	dev, err := ib.OpenDevice(ib.Config{Addrs: []netip.Addr{o.peers[me]}, Workers: 1})
	if err == nil {
		err = rdmacm.Enable(dev, nil)
	}
	if err != nil {
		if dev != nil {
			dev.Close()
		}
		return engineOpenError(fmt.Sprintf("rank %d's RoCE engine", me), o.peers[me].String(), transport.RoCEv2Port, err)
	}
	defer dev.Close()
	next := o.peers[(me+1)%n]
	fmt.Fprintf(stdout, "# ring allreduce, rank %d of %d (pid %d, %v), %s per size, %s, %s, load %s\n", me, n, os.Getpid(), o.peers[me], iterations(o.iters), rankWaitDescr(o.spin), o.procs, loadAvg())
	fmt.Fprint(stdout, allreduce.FormatHeader("rdma", "tcp"))
	var cpu []string // the CPU lines printed after the table
	for size := o.minBytes; size <= o.maxBytes; size *= 2 {
		count := size / 4
		if count < n {
			continue
		}
		cfg := allreduce.Config{Rank: me, Ranks: n, Count: count, Timeout: o.timeout, Spin: waiterSpin(o.spin)}
		var rs []allreduce.Result
		for _, tr := range []string{"rdma", "tcp"} {
			var r *allreduce.Ring
			var err error
			if tr == "rdma" {
				r, err = allreduce.DialRDMA(ctx, dev, cfg, allreduce.RDMAConfig{
					Listen: netip.AddrPortFrom(o.peers[me], uint16(o.cmPort)), Next: netip.AddrPortFrom(next, uint16(o.cmPort))})
			} else {
				r, err = allreduce.DialTCP(ctx, cfg, allreduce.TCPConfig{
					Listen: netip.AddrPortFrom(o.peers[me], uint16(o.tcpBase)).String(), Next: netip.AddrPortFrom(next, uint16(o.tcpBase)).String()})
			}
			if err != nil {
				return fmt.Errorf("rank %d of %d, %s, %d bytes: %w", me, n, tr, size, err)
			}
			if o.verbose {
				fmt.Fprintf(stdout, "# rank %d joined the %s ring for %d bytes\n", me, tr, size)
			}
			res := allreduce.MeasureRank(ctx, r, me, n, o.iters, processCPU)
			if res.Failed != nil {
				r.Close()
				return fmt.Errorf("rank %d of %d, %s, %d bytes: %w", me, n, tr, size, res.Failed)
			}
			if err := r.Leave(ctx); err != nil {
				return fmt.Errorf("rank %d of %d, %s, %d bytes: %w", me, n, tr, size, err)
			}
			rs = append(rs, res)
		}
		fmt.Fprint(stdout, allreduce.FormatLine(size, rs...))
		cpu = append(cpu, fmt.Sprintf("# %12d  %12.1f %12.1f %8.2f", size, float64(rs[0].CPU)/1e3, float64(rs[1].CPU)/1e3,
			float64(rs[0].CPU)/float64(max(rs[1].CPU, 1))))
		for i, r := range rs {
			if r.Wrong != 0 {
				return fmt.Errorf("rank %d of %d, %s, %d bytes: %d elements differ from the reference sum", me, n, []string{"rdma", "tcp"}[i], size, r.Wrong)
			}
		}
	}
	fmt.Fprintf(stdout, "# this process's CPU (user+system: the engine's and the kernel's work in its threads) per allreduce\n")
	fmt.Fprintf(stdout, "# %12s  %12s %12s %8s\n", "size (B)", "rdma cpu us", "tcp cpu us", "rdma/tcp")
	for _, l := range cpu {
		fmt.Fprintln(stdout, l)
	}
	fmt.Fprintf(stdout, "# load after: %s\n", loadAvg())
	return nil
}

// rankWaitDescr says how the RDMA ranks wait (--spin), for the header.
func rankWaitDescr(spin time.Duration) string {
	switch {
	case spin == 0:
		return "RDMA ranks sleep at once (--spin 0)"
	case spin < 0:
		return "RDMA ranks never sleep (--spin -1)"
	}
	return fmt.Sprintf("RDMA ranks spin %v then sleep (--spin)", spin)
}

// applyAllreduceProcs sets the process's GOMAXPROCS from --cpus, the
// environment and, for a rank process, its peers (chooseProcs: the rank
// processes of a loopback ring share this host's CPUs; ranks in one
// process keep them all) and says what it runs with.
func applyAllreduceProcs(cpus int, env string, peers []netip.Addr) string {
	n, why := chooseProcs(runtime.NumCPU(), cpus, env, peers, len(peers))
	if n > 0 && setMaxProcs != nil {
		setMaxProcs(n)
		return fmt.Sprintf("GOMAXPROCS %d (%s)", n, why)
	}
	return fmt.Sprintf("GOMAXPROCS %d", runtime.GOMAXPROCS(0))
}

// rankProcessSpin is --spin's default for one rank per process (--rank)
// in a ring of ranks on a host of cpus: ranks that spin are processes,
// which yield their CPU only when the kernel takes it from them, so more
// of them than CPUs (if they share this host; a rank cannot tell where
// its peers run) spin on each other's time. Measured on 2 CPUs
// (docs/workloads.md): 2 rank processes spinning took 56-79 us per 4-16
// KiB allreduce where sleeping ones took 415-617 us; 4 spinning took
// 1.3-1.6x as long as 4 sleeping. Ranks in one process are goroutines,
// which yield to each other while they spin, and keep the default.
func rankProcessSpin(ranks, cpus int) time.Duration {
	if ranks > cpus {
		return 0
	}
	return defaultSpin
}

// iterations counts the header's iterations ("1 iteration", "5 iterations").
func iterations(n int) string {
	if n == 1 {
		return "1 iteration"
	}
	return fmt.Sprintf("%d iterations", n)
}
