package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
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
		summary: "ring allreduce of float32 vectors over RDMA WRITE with immediate and over TCP, N ranks in one process; nccl-tests output",
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
}

func runAllreduce(args []string, stdout, stderr io.Writer) int {
	o := &allreduceOpts{}
	fs := flag.NewFlagSet("allreduce", flag.ContinueOnError)
	ranks := fs.String("ranks", "2,4,8", "rank `counts` to run")
	minB := fs.String("b", "4K", "smallest `size` (bytes; K, M suffixes)")
	maxB := fs.String("e", "64M", "largest `size`")
	fs.IntVar(&o.iters, "n", 5, "timed `iterations` per size (after one warm-up)")
	fs.StringVar(&o.net, "net", "udp", "`mem` (in-memory network) or udp (one engine per rank on 127.0.1.x loopback)")
	base := fs.String("addr", "127.0.1.1", "first rank's `address` (rank i uses the i-th next one)")
	fs.IntVar(&o.tcpBase, "tcp-port", 17600, "TCP ring: rank i listens on this `port` + i")
	fs.IntVar(&o.cmPort, "cm-port", 7600, "rdma_cm `port` every rank listens on")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "connection setup and per-step deadline")
	if _, code, ok := parseArgs(fs, args, stderr); !ok {
		return code
	}
	var err error
	if o.ranks, err = parseIntList(*ranks); err != nil {
		return fail(stderr, "allreduce", fmt.Errorf("--ranks: %v", err))
	}
	if o.minBytes, err = parseSize(*minB); err != nil {
		return fail(stderr, "allreduce", fmt.Errorf("-b: %v", err))
	}
	if o.maxBytes, err = parseSize(*maxB); err != nil || o.maxBytes < o.minBytes {
		return fail(stderr, "allreduce", fmt.Errorf("-e %q: a size at least -b", *maxB))
	}
	if o.base, err = netip.ParseAddr(*base); err != nil || !o.base.Is4() {
		return fail(stderr, "allreduce", fmt.Errorf("--addr %q: not an IPv4 address", *base))
	}
	if o.net != "mem" && o.net != "udp" {
		return fail(stderr, "allreduce", fmt.Errorf("--net %q: mem or udp", o.net))
	}
	if o.iters < 1 {
		return fail(stderr, "allreduce", fmt.Errorf("-n %d: at least 1", o.iters))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	failed := false
	for _, n := range o.ranks {
		if n < 2 {
			return fail(stderr, "allreduce", fmt.Errorf("--ranks: %d ranks (at least 2)", n))
		}
		fmt.Fprintf(stdout, "# ring allreduce, %d ranks in one process (%s), %d iterations per size, load %s\n", n, o.net, o.iters, loadAvg())
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
					fmt.Fprintf(stderr, "rxed allreduce: %s, %d ranks, %d bytes: %v\n", tr, n, size, r.Failed)
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
		return allreduce.Config{Rank: i, Ranks: n, Count: count, Timeout: o.timeout}
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
			return nil, fmt.Errorf("rank %d engine on %v: %v", i, a, err)
		}
		devs = append(devs, dev)
	}
	return devs, nil
}

// parseSize reads 4096, 4K, 64M.
func parseSize(s string) (int, error) {
	mult := 1
	if len(s) > 0 {
		switch s[len(s)-1] {
		case 'K', 'k':
			mult, s = 1<<10, s[:len(s)-1]
		case 'M', 'm':
			mult, s = 1<<20, s[:len(s)-1]
		case 'G', 'g':
			mult, s = 1<<30, s[:len(s)-1]
		}
	}
	var n int
	if _, err := fmt.Sscanf(s, "%d", &n); err != nil || n <= 0 {
		return 0, fmt.Errorf("%q: not a size", s)
	}
	return n * mult, nil
}
