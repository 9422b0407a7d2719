package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rxed/rxed/examples/kv"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
)

func init() {
	register(&command{
		name:    "kv",
		summary: "Pilaf-style key-value store: GETs by one-sided RDMA READ, PUTs by SEND, the same table over TCP (serve|get|put|del|bench)",
		run:     runKV,
	})
}

// kvServeContext is what `kv serve` runs under besides its signals (tests
// replace it to stop the server).
var kvServeContext = context.Background

const (
	kvCMPort  = 7471 // rdma_cm port of `rxed kv serve`
	kvTCPPort = 7472 // its TCP port
)

func runKV(args []string, stdout, stderr io.Writer) int {
	const kvUsageLine = "usage: rxed kv serve|get|put|del|bench [flags] [args]"
	// rxed kv -h is the subcommands' synopses (it was `unknown subcommand
	// "-h"`, exit 2); a bare rxed kv, a usage error, is one line.
	kvUsage := func() {
		fmt.Fprintln(stderr, kvUsageLine+" (rxed kv SUBCOMMAND -h lists its flags)")
		fmt.Fprintln(stderr, "  rxed kv serve --addr IP                 serve the table: rdma_cm port 7471, TCP 7472")
		fmt.Fprintln(stderr, "  rxed kv get|del --addr IP SERVER KEY    one GET or DELETE over RDMA (--tcp ADDR: over TCP)")
		fmt.Fprintln(stderr, "  rxed kv put --addr IP SERVER KEY VALUE  one PUT over RDMA (--tcp ADDR: over TCP)")
		fmt.Fprintln(stderr, "  rxed kv bench --addr IP --server IP     RDMA against TCP, every cell")
	}
	if len(args) == 0 {
		fmt.Fprintln(stderr, kvUsageLine+" (rxed kv -h says more)")
		return 2
	}
	switch args[0] {
	case "-h", "--help", "help":
		kvUsage()
		return 0
	case "serve":
		return runKVServe(args[1:], stdout, stderr)
	case "get", "put", "del":
		return runKVOp(args[0], args[1:], stdout, stderr)
	case "bench":
		return runKVBench(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "rxed kv: unknown subcommand %q (serve, get, put, del, bench)\n", args[0])
	return 2
}

// kvTableFlags size the server's table.
type kvTableFlags struct {
	buckets, probe int
	extent         sizeFlag
}

func (t *kvTableFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&t.buckets, "buckets", 4096, "index `buckets`")
	sizeVar(fs, &t.extent, "extent", 1024, "value extent `bytes` (the largest value; K, M suffixes)")
	fs.IntVar(&t.probe, "probe", 16, "probe window in `buckets`")
}

// check refuses sizes the table would silently replace by its defaults
// (0) or cannot use.
func (t *kvTableFlags) check() error {
	switch {
	case t.buckets < 1 || t.buckets > 1<<24:
		return fmt.Errorf("--buckets %d: want 1..%d", t.buckets, 1<<24)
	case t.extent < kv.InlineMax || t.extent%8 != 0 || t.extent > kv.MaxExtent:
		return fmt.Errorf("--extent %d: want a multiple of 8 from %d to %d", t.extent, kv.InlineMax, kv.MaxExtent)
	case t.probe < 1:
		return fmt.Errorf("--probe %d: want at least 1", t.probe)
	}
	return nil
}

func (t *kvTableFlags) config() kv.TableConfig {
	return kv.TableConfig{NBuckets: t.buckets, ExtentSize: int(min(t.extent, 1<<40)), MaxProbe: t.probe}
}

// kvServer is a running server: the engine, the table and both front ends.
type kvServer struct {
	en    *engine
	table *kv.Table
	app   *kv.App
	rdma  *kv.RDMAServer
	tcp   *kv.TCPServer
}

// startKVServer starts the server; keepAlive is its RDMA side's
// (kv.RDMAServerConfig.KeepAlive: 0 the default, negative none), maxConns
// the clients each side serves at once (kv.RDMAServerConfig.MaxConns and
// kv.TCPServerConfig.MaxConns: 0 kv.DefaultMaxConns).
func startKVServer(ef *engineFlags, tf kvTableFlags, handlerCPU bool, cmPort uint, tcpAddr string, keepAlive time.Duration, maxConns int, stderr io.Writer) (*kvServer, error) {
	s := &kvServer{}
	var err error
	if s.table, err = kv.NewTable(tf.config()); err != nil {
		return nil, err
	}
	s.app = kv.NewApp(s.table)
	if handlerCPU {
		s.app.MeasureHandlerCPU()
	}
	ef.busyPoll = kvServerBusyPoll(ef.spin)
	if s.en, err = ef.open(ef.logger(stderr)); err != nil {
		s.table.Close()
		return nil, err
	}
	if s.rdma, err = kv.ServeRDMA(s.app, s.en.dev, netip.AddrPortFrom(ef.addrs[0], uint16(cmPort)),
		&kv.RDMAServerConfig{Logger: ef.logger(stderr), KeepAlive: keepAlive, MaxConns: maxConns}); err != nil {
		s.close()
		return nil, err
	}
	ln, err := net.Listen("tcp", tcpAddr)
	if err != nil {
		s.close()
		return nil, fmt.Errorf("tcp: %v", err)
	}
	if s.tcp, err = kv.ServeTCPWith(s.app, ln, &kv.TCPServerConfig{MaxConns: maxConns}); err != nil {
		ln.Close()
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *kvServer) close() error {
	if s.tcp != nil {
		s.tcp.Close()
	}
	if s.rdma != nil {
		s.rdma.Close()
	}
	var err error
	if s.en != nil {
		err = s.en.close()
	}
	s.table.Close()
	return err
}

func runKVServe(args []string, stdout, stderr io.Writer) int {
	var ef engineFlags
	var tf kvTableFlags
	fs := flag.NewFlagSet("kv serve", flag.ContinueOnError)
	ef.register(fs, false)
	ef.registerSpinUsage(fs, "keep the engine polling its socket this long after the last packet before it sleeps (`duration`; -1: the default budget; 0: sleep at once, a thread wake-up per GET)")
	tf.register(fs)
	cmPort := fs.Uint("cm-port", kvCMPort, "rdma_cm `port`")
	tcpAddr := fs.String("tcp", "", "TCP `address` (default the first --addr, port 7472)")
	handlerCPU := fs.Bool("handler-cpu", false, handlerCPUUsage)
	dur := fs.Duration("for", 0, "stop after this `duration` (default: until SIGINT/SIGTERM)")
	keepAlive := fs.Duration("keepalive", kv.DefaultKeepAlive, "probe an RDMA connection idle this long with a zero-length RDMA WRITE, and free the slot of a client that no longer answers (`duration`; 0: never)")
	maxConns := fs.Int("max-conns", kv.DefaultMaxConns, "clients served at once by each side: RDMA connections (one more is refused with REJ \"kv: too many clients\") and TCP connections (one more is answered busy and closed as it is accepted); `N` at least 1")
	if _, code, ok := parseArgs(fs, args, stderr); !ok {
		return code
	}
	ka, kaErr := kvKeepAlive(*keepAlive)
	if err := errors.Join(ef.check(), tf.check(), kaErr, kvMaxConns(*maxConns)); err != nil {
		fail(stderr, "kv serve", err)
		return 2 // a usage error
	}
	if *tcpAddr == "" {
		*tcpAddr = netip.AddrPortFrom(ef.addrs[0], kvTCPPort).String()
	}
	s, err := startKVServer(&ef, tf, *handlerCPU, *cmPort, *tcpAddr, ka, *maxConns, stderr)
	if err != nil {
		return fail(stderr, "kv serve", err)
	}
	c := tf.config()
	fmt.Fprintf(stdout, "kv: serving %d buckets, values up to %d bytes; rdma_cm %v, tcp %v\n",
		c.NBuckets, c.ExtentSize, s.rdma.Addr(), s.tcp.Addr())
	ctx, stop := signal.NotifyContext(kvServeContext(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if *dur > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *dur)
		defer cancel()
	}
	<-ctx.Done()
	rs, ts := s.app.Stats()
	fmt.Fprintf(stdout, "kv: stopped; rdma handler: %d puts %d deletes, tcp handler: %d gets %d puts %d deletes\n",
		rs.Puts, rs.Deletes, ts.Gets, ts.Puts, ts.Deletes)
	if err := s.close(); err != nil {
		return fail(stderr, "kv serve", err)
	}
	return 0
}

// kvKeepAlive is kv serve's --keepalive as kv.RDMAServerConfig.KeepAlive,
// whose 0 is the default and negative never.
func kvKeepAlive(d time.Duration) (time.Duration, error) {
	switch {
	case d < 0:
		return 0, fmt.Errorf("--keepalive %v: want 0 (never) or a positive duration", d)
	case d == 0:
		return -1, nil
	}
	return d, nil
}

// kvMaxConns checks kv serve's --max-conns: the servers' 0 means their
// default, which the flag already is, so a 0 given would quietly serve
// 256; the RDMA side's upper bound (its CQ's size) is ServeRDMA's to say.
func kvMaxConns(n int) error {
	if n < 1 {
		return fmt.Errorf("--max-conns %d: want at least 1 (default %d)", n, kv.DefaultMaxConns)
	}
	return nil
}

// runKVOp is one GET, PUT or DELETE against a running server.
func runKVOp(name string, args []string, stdout, stderr io.Writer) int {
	var ef engineFlags
	fs := flag.NewFlagSet("kv "+name, flag.ContinueOnError)
	ef.register(fs, false)
	cmPort := fs.Uint("cm-port", kvCMPort, "server's rdma_cm `port`")
	useTCP := fs.String("tcp", "", "use TCP to this `address` instead of RDMA (no --addr needed)")
	rest, code, ok := parseArgs(fs, args, stderr)
	if !ok {
		return code
	}
	usageErr := func(err error) int {
		fail(stderr, "kv "+name, err)
		return 2
	}
	want := map[string]int{"get": 2, "put": 3, "del": 2}[name]
	if len(rest) != want {
		usage := map[string]string{"get": "SERVER KEY", "put": "SERVER KEY VALUE", "del": "SERVER KEY"}[name]
		return usageErr(fmt.Errorf("want %s after the flags, got %d argument(s) %q (flags after them are taken for arguments)", usage, len(rest), rest))
	}
	// The context is the --timeout: a zero or negative one is refused
	// before it is made, for --tcp too (ef.check, which the RDMA path
	// runs, refuses it there as well).
	if ef.timeout <= 0 {
		return usageErr(fmt.Errorf("--timeout %v must be positive", ef.timeout))
	}
	ctx, cancel := context.WithTimeout(context.Background(), ef.timeout)
	defer cancel()
	var c kv.Client
	if *useTCP != "" {
		tc, err := kv.DialTCP(ctx, *useTCP)
		if err != nil {
			return fail(stderr, "kv "+name, err)
		}
		c = tc
	} else {
		if err := ef.check(); err != nil {
			return usageErr(err)
		}
		srv, err := netip.ParseAddr(rest[0])
		if err != nil {
			return usageErr(fmt.Errorf("server %q: not an IP address", rest[0]))
		}
		en, err := ef.open(ef.logger(stderr))
		if err != nil {
			return fail(stderr, "kv "+name, err)
		}
		defer en.close()
		raddr := netip.AddrPortFrom(srv, uint16(*cmPort))
		rc, err := kv.DialRDMA(ctx, en.dev, raddr, nil)
		if err != nil {
			return fail(stderr, "kv "+name, kvDialErr(ctx, raddr, ef.timeout, err))
		}
		c = rc
	}
	defer c.Close()
	key := []byte(rest[1])
	var err error
	switch name {
	case "get":
		var v []byte
		if v, err = c.Get(ctx, key); err == nil {
			fmt.Fprintf(stdout, "%s\n", v)
		}
	case "put":
		err = c.Put(ctx, key, []byte(rest[2]))
	case "del":
		err = c.Delete(ctx, key)
	}
	if err != nil {
		return fail(stderr, "kv "+name, kvBusyHint(err))
	}
	return 0
}

// kvBusyHint says what to do about a server that turned the client away
// at its connection cap (kv.ErrServerBusy: a TCP busy answer or the RDMA
// server's REJ "kv: too many clients"); other errors pass unchanged. Bug
// (workload edges, task N): over TCP the refusal read as "connection lost
// (server closed, restarted or unreachable)", over RDMA as "rejected:
// consumer defined (28)".
func kvBusyHint(err error) error {
	if errors.Is(err, kv.ErrServerBusy) {
		return fmt.Errorf("%w (raise --max-conns on the server, rxed kv serve; default %d)", err, kv.DefaultMaxConns)
	}
	return err
}

// kvDialErr is a failed connect to a kv server in one line: the REJ's
// reason, or, when the wait ran out, that nobody answered within
// --timeout, as perf -R and the rdma_cm tools say it (it was Go's
// "context deadline exceeded"). The client's REQ gives up on its own
// before the default --timeout (kv.DialRDMA's CM timeout, 10 s), and
// that says the same with its cause: it was "no answer from the peer
// (CM timeout)", which did not name the peer nor what should answer.
func kvDialErr(ctx context.Context, raddr netip.AddrPort, timeout time.Duration, err error) error {
	const hint = "(is rxed kv serve running there?)"
	switch {
	case errors.Is(err, kv.ErrServerBusy):
		return kvBusyHint(err)
	case ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("connect %v: no answer within --timeout %v %s", raddr, timeout, hint)
	case errors.Is(err, rdmacm.ErrTimeout):
		return fmt.Errorf("connect %v: no answer (CM timeout) %s", raddr, hint)
	}
	return cmError(err)
}

func kvRDMADialer(ctx context.Context, dev *ib.Device, srv netip.AddrPort, spin time.Duration, readAhead int) func() (kv.Client, error) {
	return func() (kv.Client, error) {
		c, err := kv.DialRDMA(ctx, dev, srv, &kv.RDMAClientConfig{Spin: waiterSpin(spin), ReadAhead: readAhead})
		if errors.Is(err, kv.ErrServerBusy) {
			return nil, err // its own words, not cmError's bare REJ (kvBusyHint)
		}
		if err != nil {
			return nil, cmError(err)
		}
		return c, nil
	}
}

func parseIntList(s string) ([]int, error) {
	var out []int
	for f := range splitComma(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q: not a positive number", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

func splitComma(s string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for f := range strings.SplitSeq(s, ",") {
			if f = strings.TrimSpace(f); f != "" && !yield(f) {
				return
			}
		}
	}
}

type kvBenchOpts struct {
	ef      engineFlags
	tf      kvTableFlags
	server  netip.Addr
	cmPort  uint
	tcpPort uint
	spawn   bool
	inproc  bool
	// handlerCPU: the server measures its handlers' CPU (kv.App.MeasureHandlerCPU)
	handlerCPU bool
	clients    []int
	gets       []int
	dur        time.Duration
	ops        int
	keys       int
	valueLen   int
	readAhead  int // kv.RDMAClientConfig.ReadAhead
}

func parseKVBench(args []string, stderr io.Writer) (*kvBenchOpts, int, bool) {
	o := &kvBenchOpts{}
	fs := flag.NewFlagSet("kv bench", flag.ContinueOnError)
	o.ef.register(fs, false)
	o.ef.registerSpin(fs)
	fs.DurationVar(&o.ef.doorbell, "doorbell", kvDoorbell, "let the clients' posts wait up to this `duration` to leave together while four or more of them spin (ib.Config.DoorbellBatch; 0: each post leaves at once)")
	o.tf.register(fs)
	server := fs.String("server", "", "the server's `address` (its engine, rdma_cm and TCP)")
	fs.UintVar(&o.cmPort, "cm-port", kvCMPort, "server's rdma_cm `port`")
	fs.UintVar(&o.tcpPort, "tcp-port", kvTCPPort, "server's TCP `port`")
	fs.BoolVar(&o.spawn, "spawn", true, "start `rxed kv serve` on --server as a child process (its CPU is then measured)")
	fs.BoolVar(&o.inproc, "inproc", false, "run the server in this process instead (no separate server CPU)")
	fs.BoolVar(&o.handlerCPU, "handler-cpu", false, handlerCPUUsage)
	clients := fs.String("clients", "1,4,16", "client `counts`")
	gets := fs.String("get", "100,90", "GET `percentages` (the rest are PUTs)")
	fs.DurationVar(&o.dur, "D", 2*time.Second, "`duration` of each cell")
	fs.IntVar(&o.ops, "n", 0, "operations per client per cell instead of -D")
	fs.IntVar(&o.keys, "keys", 1000, "`keys` preloaded and read uniformly")
	fs.IntVar(&o.readAhead, "read-ahead", 0, "`bytes` of a bucket's extent an RDMA GET reads beside the bucket, in one round trip: 0, the last out-of-line value's length; -1, none (bucket, then value: two round trips); N, always N")
	var valueLen sizeFlag
	sizeVar(fs, &valueLen, "s", 256, "value `size` in bytes, K suffix (at most 64 is one READ, else two: bucket and value, posted together once a client has found a value out of line)")
	if _, code, ok := parseArgs(fs, args, stderr); !ok {
		return nil, code, false
	}
	o.valueLen = int(min(valueLen, 1<<40))
	bad := func(err error) (*kvBenchOpts, int, bool) {
		fail(stderr, "kv bench", err)
		return nil, 2, false
	}
	// With --inproc both ends are this process: its CPUs are not shared
	// with a peer process (cpus.go).
	o.ef.peerInProcess = o.inproc
	if err := errors.Join(o.ef.check(), o.tf.check()); err != nil {
		return bad(err)
	}
	var err error
	if o.server, err = netip.ParseAddr(*server); err != nil {
		return bad(fmt.Errorf("--server %q: not an IP address", *server))
	}
	if o.clients, err = parseIntList(*clients); err != nil {
		return bad(fmt.Errorf("--clients: %v", err))
	}
	if o.gets, err = parseIntList(*gets); err != nil || slices.ContainsFunc(o.gets, func(p int) bool { return p > 100 }) {
		return bad(fmt.Errorf("--get %q: percentages 1..100", *gets))
	}
	if o.keys < 1 || o.keys > o.tf.buckets/2 {
		return bad(fmt.Errorf("--keys %d: 1..%d (half the buckets)", o.keys, o.tf.buckets/2))
	}
	if o.valueLen < 0 || o.valueLen > int(o.tf.extent) {
		return bad(fmt.Errorf("-s %d: 0..%d (--extent)", o.valueLen, o.tf.extent))
	}
	if o.server == o.ef.addrs[0] {
		return bad(errors.New("--server and --addr must differ (two engines on one address and port)"))
	}
	return o, 0, true
}

func runKVBench(args []string, stdout, stderr io.Writer) int {
	o, code, ok := parseKVBench(args, stderr)
	if !ok {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	tcpAddr := netip.AddrPortFrom(o.server, uint16(o.tcpPort)).String()
	var serverCPU func() (time.Duration, error)
	switch {
	case o.inproc:
		sf := o.ef
		sf.addrs = addrList{o.server}
		sf.pcap, sf.countersOut = "", ""
		s, err := startKVServer(&sf, o.tf, o.handlerCPU, o.cmPort, tcpAddr, 0, kvBenchMaxConns(o), stderr)
		if err != nil {
			return fail(stderr, "kv bench", fmt.Errorf("server: %v", err))
		}
		defer s.close()
	case o.spawn:
		child, err := spawnKVServer(o, tcpAddr, stderr)
		if err != nil {
			return fail(stderr, "kv bench", err)
		}
		defer child.stop()
		serverCPU = child.cpu
	}
	en, err := o.ef.open(o.ef.logger(stderr))
	if err != nil {
		return fail(stderr, "kv bench", err)
	}
	defer en.close()
	stats, err := kv.DialTCP(ctx, tcpAddr)
	if err != nil {
		return fail(stderr, "kv bench", err)
	}
	defer stats.Close()
	cm := netip.AddrPortFrom(o.server, uint16(o.cmPort))
	cfg := kv.BenchConfig{Clients: o.clients, GetPercents: o.gets, Duration: o.dur, Ops: o.ops, Keys: o.keys,
		ValueLen: o.valueLen, Seed: 1, ServerStats: stats.ServerStats, ServerCPU: serverCPU, ClientCPU: processCPU,
		HandlerCPU: o.handlerCPU && (o.inproc || o.spawn),
		Transports: []kv.BenchTransport{
			{Name: "rdma", Dial: func(ctx context.Context) (kv.Client, error) {
				return kvRDMADialer(ctx, en.dev, cm, o.ef.spin, o.readAhead)()
			}},
			{Name: "tcp", Dial: func(ctx context.Context) (kv.Client, error) { return kv.DialTCP(ctx, tcpAddr) }},
		}}
	fmt.Fprintf(stdout, "# kv bench: server %v (%s), clients on %v, %d keys, %d-byte values, %s per cell, %s, %s, %s, load %s\n",
		o.server, o.serverWhere(), o.ef.addrs[0],
		o.keys, o.valueLen, cellLen(o), kvReadAheadDescr(o.readAhead), kvWaitDescr(o.ef.spin), kvDoorbellDescr(o.ef.doorbell), loadAvg())
	rs, err := kv.Bench(ctx, cfg)
	kv.WriteBenchTable(stdout, rs)
	if err != nil {
		return fail(stderr, "kv bench", kvBusyHint(err))
	}
	fmt.Fprintf(stdout, "# load after: %s\n", loadAvg())
	return 0
}

// serverWhere says in the header where the server runs: in this process
// (--inproc), as our child (the default), or as a server that was already
// running (--spawn=false), whose process is neither this one nor ours.
func (o *kvBenchOpts) serverWhere() string {
	switch {
	case o.inproc:
		return "in process"
	case o.spawn:
		return "own process"
	}
	return "already running, --spawn=false"
}

func cellLen(o *kvBenchOpts) string {
	if o.ops > 0 {
		return fmt.Sprintf("%d ops/client", o.ops)
	}
	return o.dur.String()
}

// loadAvg is /proc/loadavg's first three fields ("-" elsewhere).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "-"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "-"
	}
	return strings.Join(f[:3], " ")
}

// kvChild is `rxed kv serve` run by the benchmark.
type kvChild struct {
	cmd *exec.Cmd
}

// kvServeArgs is the command line of the server kv bench spawns: its
// table, addresses and --spin are the bench's.
func kvServeArgs(o *kvBenchOpts, tcpAddr string) []string {
	return []string{"kv", "serve", "--addr", o.server.String(), "--port", strconv.Itoa(int(o.ef.port)),
		"--cm-port", strconv.Itoa(int(o.cmPort)), "--tcp", tcpAddr,
		"--buckets", strconv.Itoa(o.tf.buckets), "--extent", o.tf.extent.String(), "--probe", strconv.Itoa(o.tf.probe),
		"--spin", (*spinFlag)(&o.ef.spin).String(), "--handler-cpu=" + strconv.FormatBool(o.handlerCPU),
		"--max-conns", strconv.Itoa(kvBenchMaxConns(o))}
}

// kvBenchMaxConns is the connection cap of the server kv bench starts:
// the default, or its largest client count and the bench's own stats
// connection if that is more, so that a cell of more clients than
// kv.DefaultMaxConns is served, not refused.
func kvBenchMaxConns(o *kvBenchOpts) int {
	n := kv.DefaultMaxConns
	for _, c := range o.clients {
		n = max(n, c+1)
	}
	return n
}

func spawnKVServer(o *kvBenchOpts, tcpAddr string, stderr io.Writer) (*kvChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, kvServeArgs(o, tcpAddr)...)
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the server (%s kv serve): %v", exe, err)
	}
	c := &kvChild{cmd: cmd}
	ready := make(chan error, 1)
	go func() {
		r := bufio.NewReader(out)
		line, err := r.ReadString('\n')
		if err == nil && !strings.HasPrefix(line, "kv: serving") {
			err = fmt.Errorf("unexpected output %q", line)
		}
		ready <- err
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case err := <-ready:
		if err != nil {
			c.stop()
			return nil, fmt.Errorf("the server did not start: %v", err)
		}
	case <-time.After(o.ef.timeout):
		c.stop()
		return nil, fmt.Errorf("the server did not start within %v", o.ef.timeout)
	}
	return c, nil
}

// cpu is the child's user+system CPU time from /proc/PID/stat.
func (c *kvChild) cpu() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("bad /proc stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("bad /proc stat")
	}
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100, nil // USER_HZ
}

func (c *kvChild) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// kvServerBusyPoll is kv serve's device BusyPoll for --spin. The server's
// application runs for PUTs and DELETEs only; a GET is a READ its engine
// serves alone, as a NIC would, so nothing polls the device between GETs
// (deviceBusyPoll's idle server).
func kvServerBusyPoll(spin time.Duration) time.Duration { return deviceBusyPoll(true, false, spin) }

// handlerCPUUsage is kv serve's and kv bench's --handler-cpu.
const handlerCPUUsage = "measure the server's request handlers' CPU (the app CPU columns): locks each handler goroutine to its thread, which costs a thread switch per request wake-up, TCP's and RDMA's"

// kvReadAheadDescr says how a kv bench run's RDMA GETs read a value out of
// line (--read-ahead), for its header.
func kvReadAheadDescr(n int) string {
	switch {
	case n < 0:
		return "GETs read bucket, then value (--read-ahead -1)"
	case n > 0:
		return fmt.Sprintf("GETs read %d bytes of value beside the bucket (--read-ahead)", n)
	}
	return "GETs read the last value's length beside the bucket (--read-ahead)"
}

// kvWaitDescr says how a kv bench run waits (--spin), for its header.
func kvWaitDescr(spin time.Duration) string {
	switch {
	case spin == 0:
		return "clients and server sleep at once (--spin 0)"
	case spin < 0:
		return fmt.Sprintf("clients never sleep, the server's engine polls %v after traffic (--spin -1)", kvServerBusyPoll(spin))
	}
	return fmt.Sprintf("clients spin %v then sleep, the server's engine polls %v after traffic (--spin)", spin, kvServerBusyPoll(spin))
}

// kvDoorbell is kv bench's --doorbell: the clients' device batches the
// posts of its spinning connections (ib.Config.DoorbellBatch). 20 us:
// 16 clients made 172,000-191,000 GETs/s with it, 120,000-137,000 with
// 5 us, 89,500-91,500 without (docs/performance.md, session X).
const kvDoorbell = 20 * time.Microsecond

// kvDoorbellDescr says whether the clients' posts are batched, for the
// header.
func kvDoorbellDescr(d time.Duration) string {
	if d <= 0 {
		return "each post sent at once (--doorbell 0)"
	}
	return fmt.Sprintf("posts batched for up to %v while 4 or more clients spin (--doorbell)", d)
}
