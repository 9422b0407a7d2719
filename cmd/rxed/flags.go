package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// addrList is the repeatable --addr flag: the local addresses, in GID
// table order.
type addrList []netip.Addr

func (a *addrList) String() string {
	s := make([]string, len(*a))
	for i, x := range *a {
		s[i] = x.String()
	}
	return strings.Join(s, ",")
}

func (a *addrList) Set(v string) error {
	for part := range strings.SplitSeq(v, ",") {
		x, err := netip.ParseAddr(strings.TrimSpace(part))
		if err != nil {
			return fmt.Errorf("not an IP address: %q", part)
		}
		*a = append(*a, x.Unmap())
	}
	return nil
}

// engineFlags are the flags every engine-running command accepts after
// its name: --addr, --port, --fault, --pcap, and the tools' -p.
type engineFlags struct {
	addrs       addrList
	port        uint
	fault       string
	pcap        string
	oobPort     uint
	timeout     time.Duration
	countersOut string
	verbose     bool
	spin        time.Duration // --spin of the tools that wait for completions (cqwait.go)
	busyPoll    time.Duration // ib.Config.BusyPoll the command asks for (idleServerBusyPoll); not a flag
	doorbell    time.Duration // ib.Config.DoorbellBatch (kv bench's --doorbell)
	cpus        int           // --cpus: GOMAXPROCS (cpus.go); 0 automatic
	cpuChoice   cpuChoice     // what --cpus or its default changed (check)
	// peerInProcess: the command holds its peers itself (kv bench
	// --inproc), so a loopback --addr does not mean a peer process.
	peerInProcess bool

	faultCfg transport.FaultConfig
	// activeMTU is the port's active MTU the command asks for (its -m);
	// 0 keeps the device default (4096).
	activeMTU ib.MTU
}

// faultSpecHelp is the keys of a --fault spec (transport.ParseFaultSpec)
// as every command's help gives them; docs/tools.md lists the same
// (TestFaultHelpNamesEveryKey).
const faultSpecHelp = "loss=P,dup=P,reorder=P,corrupt=P,delay=D,jitter=D,seed=N (also hold=D,depth=N,dir=send|receive|both,queue=N)"

// register adds the common flags to fs. oobPort is false for commands
// without an out-of-band exchange.
func (e *engineFlags) register(fs *flag.FlagSet, oobPort bool) {
	fs.Var(&e.addrs, "addr", "local IPv4/IPv6 `address` to bind (repeatable; GID table order, index 0 first)")
	fs.UintVar(&e.port, "port", transport.RoCEv2Port, "UDP `port` of the RoCEv2 engine (peers are assumed to use the same)")
	fs.StringVar(&e.fault, "fault", "", "fault injection `spec`: "+faultSpecHelp)
	fs.StringVar(&e.pcap, "pcap", "", "record the engine's traffic to pcap `file`")
	fs.DurationVar(&e.timeout, "timeout", oob.DefaultTimeout, "give up on a silent peer or a stalled run after this `duration`")
	fs.StringVar(&e.countersOut, "counters-out", "", "write the engine's counters as JSON to `file` at exit")
	fs.BoolVar(&e.verbose, "debug", false, "debug logging to stderr")
	fs.IntVar(&e.cpus, "cpus", 0, "CPUs the Go runtime uses (GOMAXPROCS; default: all, or half when every --addr is a loopback address and the peer shares the host)")
	if oobPort {
		fs.UintVar(&e.oobPort, "p", oob.DefaultPort, "TCP `port` of the out-of-band exchange")
	}
}

// check validates the common flags after parsing.
func (e *engineFlags) check() error {
	if len(e.addrs) == 0 {
		return errors.New("--addr is required (the local IP address the engine binds)")
	}
	if e.port == 0 || e.port > 65535 {
		return fmt.Errorf("--port %d out of range 1..65535", e.port)
	}
	if err := checkOOBPort(e.oobPort); err != nil {
		return err
	}
	if e.timeout <= 0 {
		return fmt.Errorf("--timeout %v must be positive", e.timeout)
	}
	if err := e.checkCPUs(); err != nil {
		return err
	}
	e.applyCPUs(os.Getenv("GOMAXPROCS"))
	cfg, err := transport.ParseFaultSpec(e.fault)
	if err != nil {
		return fmt.Errorf("--fault: %v", err)
	}
	e.faultCfg = cfg
	return nil
}

// logger returns the command's logger: warnings and errors to stderr,
// debug too with -v.
func (e *engineFlags) logger(stderr io.Writer) *slog.Logger {
	lvl := slog.LevelWarn
	if e.verbose {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
}

// engine is an opened device with what the common flags attached to it.
type engine struct {
	dev      *ib.Device
	pcapFile *os.File
	flags    *engineFlags

	// closeOnce makes close safe to call twice, and concurrently: by the
	// command and by an interrupt (interrupt.go).
	closeOnce sync.Once
	closeErr  error
}

// cmLinger is how long a command's exit waits for its rdma_cm connections
// to finish disconnecting (rdmacm.Config.Linger): the kernel's CM outlives
// the process, rxed's ends with it, so it waits for the timewait (2 s
// with rdma_cm's values) in which a peer whose DREP was lost retries.
const cmLinger = 3 * time.Second

// deviceConfig is the device configuration the flags describe. With
// --pcap it creates the capture file, which the caller closes.
func (e *engineFlags) deviceConfig(log *slog.Logger) (ib.Config, *os.File, error) {
	e.logCPUs(log)
	cfg := ib.Config{Addrs: e.addrs, Port: uint16(e.port), Logger: log, ActiveMTU: e.activeMTU, BusyPoll: e.busyPoll, DoorbellBatch: e.doorbell}
	if fc := e.faultCfg; fc.Loss != 0 || fc.Dup != 0 || fc.Reorder != 0 || fc.Corrupt != 0 || fc.Delay != 0 || fc.Jitter != 0 {
		cfg.Fault = &fc
	}
	if e.pcap == "" {
		return cfg, nil, nil
	}
	f, err := os.Create(e.pcap)
	if err != nil {
		return cfg, nil, fmt.Errorf("--pcap: %w", err)
	}
	cfg.Pcap = f
	return cfg, f, nil
}

// open opens the device the flags describe.
func (e *engineFlags) open(log *slog.Logger) (*engine, error) {
	cfg, pcapFile, err := e.deviceConfig(log)
	if err != nil {
		return nil, err
	}
	dev, err := ib.OpenDevice(cfg)
	if err != nil {
		if pcapFile != nil {
			pcapFile.Close()
		}
		return nil, engineOpenError("the RoCE engine", e.addrs.String(), e.port, err)
	}
	// Every engine answers the IB CM on QP 1, as a kernel device does: a
	// peer's rdma_cm REQ gets its REP, or REJ 8 when nobody listens.
	if err := rdmacm.Enable(dev, &rdmacm.Config{Logger: log, Linger: cmLinger}); err != nil {
		dev.Close()
		if pcapFile != nil {
			pcapFile.Close()
		}
		return nil, fmt.Errorf("starting the connection manager: %v", err)
	}
	return &engine{dev: dev, pcapFile: pcapFile, flags: e}, nil
}

// close stops the engine, then writes --counters-out and closes the pcap.
// The counters are read after Close, which sends what the device still
// owes (the connection manager's DREQ or DREP, the last batch): read
// before, they missed it while the pcap held it.
func (en *engine) close() error {
	en.closeOnce.Do(func() { en.closeErr = en.closeNow() })
	return en.closeErr
}

func (en *engine) closeNow() error {
	err := en.dev.Close()
	counters := en.dev.Counters()
	if en.pcapFile != nil {
		if cerr := en.pcapFile.Close(); err == nil {
			err = cerr
		}
	}
	if en.flags.countersOut != "" {
		if werr := writeCountersJSON(en.flags.countersOut, counters); err == nil {
			err = werr
		}
	}
	return err
}

// gid returns the address at GID index i, with a one-line error naming
// the flag.
func (e *engineFlags) gid(flagName string, i int) (netip.Addr, error) {
	if i < 0 || i >= len(e.addrs) {
		return netip.Addr{}, fmt.Errorf("%s %d: no such GID index (the table has %d: %s)", flagName, i, len(e.addrs), e.addrs.String())
	}
	return e.addrs[i], nil
}

// writeCountersJSON writes {"counter": value, ...} sorted by name.
func writeCountersJSON(path string, m map[string]uint64) error {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("{\n")
	for i, k := range names {
		kj, _ := json.Marshal(k)
		fmt.Fprintf(&b, "  %s: %d", kj, m[k])
		if i < len(names)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("}\n")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("--counters-out: %v", err)
	}
	return nil
}

// checkOOBPort checks -p, the TCP port of a tool's exchange (0 disables
// serve's perftest listener).
func checkOOBPort(p uint) error {
	if p > 65535 {
		return fmt.Errorf("-p %d out of range 0..65535", p)
	}
	return nil
}

// parseArgs parses args with fs, printing a one-line error for bad flags.
// It returns the positional arguments and ok=false with the exit status
// when parsing failed or help was asked for.
func parseArgs(fs *flag.FlagSet, args []string, stderr io.Writer) (rest []string, code int, ok bool) {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fmt.Fprintf(stderr, "usage: rxed %s [flags]%s\n", fs.Name(), argSynopsis(fs.Name()))
			fs.PrintDefaults()
			return nil, 0, false
		}
		fmt.Fprintf(stderr, "rxed %s: %v (see rxed %s -h)\n", fs.Name(), err, fs.Name())
		return nil, 2, false
	}
	return fs.Args(), 0, true
}

// argSynopsis is what follows "[flags]" in the usage line of command name
// (its FlagSet's name): the positional arguments. Bug (newcomer
// walkthrough of docs/tools.md): every -h said "usage: rxed NAME [flags]",
// so nothing said that a pingpong or perf client is the same command with
// the server's address, or what kv get wants after its flags.
func argSynopsis(name string) string {
	switch {
	case name == "pingpong", strings.HasPrefix(name, "perf "):
		return " [SERVER]   (no SERVER: the server; SERVER: a client of it)"
	case name == "kv get", name == "kv del":
		return " SERVER KEY   (SERVER: the server's IP address, any word with --tcp)"
	case name == "kv put":
		return " SERVER KEY VALUE   (SERVER: the server's IP address, any word with --tcp)"
	}
	return ""
}

// parseArgsAnywhere is parseArgs for the commands that mirror perftest
// and the pingpong tools, whose getopt takes flags before and after the
// server address alike (ib_write_bw 10.0.0.1 -s 65536): every argument
// that is not a flag or a flag's value is returned in order. "--" ends
// the flags.
func parseArgsAnywhere(fs *flag.FlagSet, args []string, stderr io.Writer) (rest []string, code int, ok bool) {
	for {
		left, code, ok := parseArgs(fs, args, stderr)
		if !ok {
			return nil, code, false
		}
		if len(left) == 0 {
			return rest, 0, true
		}
		if n := len(args) - len(left); n > 0 && args[n-1] == "--" {
			return append(rest, left...), 0, true
		}
		rest = append(rest, left[0])
		args = left[1:]
	}
}

// fail prints the one-line error of command name and returns status 1.
func fail(stderr io.Writer, name string, err error) int {
	msg := strings.ReplaceAll(err.Error(), "\n", " ") + nextStep(err)
	fmt.Fprintf(stderr, "rxed %s: %s\n", name, msg)
	return 1
}

// withWait bounds a server's wait for its client by --wait (0: as long as
// ctx allows).
func withWait(ctx context.Context, wait time.Duration) (context.Context, context.CancelFunc) {
	if wait <= 0 {
		return ctx, func() {}
	}
	w := &waitExpired{wait: wait, deadline: time.Now().Add(wait)}
	return context.WithDeadline(context.WithValue(ctx, waitKey{}, w), w.deadline)
}

// waitExpired is the error of a --wait that ran out (waitErr).
type waitExpired struct {
	wait     time.Duration
	deadline time.Time
}

func (e *waitExpired) Error() string { return fmt.Sprintf("no client within --wait %v", e.wait) }

type waitKey struct{}

// waitErr is err, or the --wait that ran out if that is why the wait on
// wctx (from withWait) failed: "no client within --wait 5s" instead of
// the context's "context deadline exceeded" or a listener's own timeout
// message (the oob listeners turn the deadline into a socket deadline,
// which may fire before the context's timer).
func waitErr(wctx context.Context, err error) error {
	w, _ := wctx.Value(waitKey{}).(*waitExpired)
	if err == nil || w == nil || time.Now().Before(w.deadline) {
		return err
	}
	return w
}

// closeEngineAndMemory stops the engine first (so nothing touches the
// memory any more), then deregisters the region and unmaps its memory.
func closeEngineAndMemory(en *engine, region *ib.MR, m *mr.Mapping) error {
	var err error
	if en != nil {
		err = en.close()
	}
	if region != nil {
		_ = region.Dereg()
	}
	if m != nil {
		_ = m.Close()
	}
	return err
}

// listenAddress is a server's TCP listen address for its exchange: the
// --listen flag's value (an address, or address:port) with port (-p) when
// it names none; "" listens on every address, as perftest and the
// ibv_*_pingpong tools do.
func listenAddress(listen string, port uint) (string, error) {
	if listen == "" {
		return ":" + strconv.Itoa(int(port)), nil
	}
	if ap, err := netip.ParseAddrPort(listen); err == nil {
		return ap.String(), nil
	}
	a, err := netip.ParseAddr(strings.Trim(listen, "[]"))
	if err != nil {
		return "", fmt.Errorf("--listen %q: want an IP address or address:port", listen)
	}
	return netip.AddrPortFrom(a, uint16(port)).String(), nil
}
