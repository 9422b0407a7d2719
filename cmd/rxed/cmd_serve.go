package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rxed/rxed/internal/daemon"
	"github.com/rxed/rxed/pkg/oob"
)

func init() {
	register(&command{
		name:    "serve",
		summary: "the daemon: export memory regions to RDMA peers and perftest clients, /metrics, graceful SIGTERM",
		run:     runServe,
	})
}

// exportList is the repeatable --export flag.
type exportList []daemon.ExportSpec

func (l *exportList) String() string {
	s := make([]string, len(*l))
	for i, e := range *l {
		s[i] = e.String()
	}
	return strings.Join(s, " ")
}

func (l *exportList) Set(v string) error {
	e, err := daemon.ParseExport(v)
	if err != nil {
		return err
	}
	*l = append(*l, e)
	return nil
}

type serveOpts struct {
	ef          engineFlags
	exports     exportList
	metrics     string
	perftestExp string
	gidx        int
	mtu         int
	qpTimeout   uint
	grace       time.Duration
	maxSessions int
	logLevel    string
	logFormat   string
	config      string

	// rdmaCMPort is --rdma-cm-port: perftest -R clients (0: off).
	rdmaCMPort uint

	// Security (docs/security.md).
	listen          string
	allow           prefixList
	token           string
	tokenFile       string
	tokenBytes      []byte
	allowUnverified bool
	handshake       time.Duration
	idle            time.Duration
	perSource       int
	sessionBytes    sizeFlag // 0: no bound
	maxRead         sizeFlag // 0: no bound
}

// prefixList is the repeatable --allow flag.
type prefixList []netip.Prefix

func (l *prefixList) String() string {
	s := make([]string, len(*l))
	for i, p := range *l {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func (l *prefixList) Set(v string) error {
	for part := range strings.SplitSeq(v, ",") {
		part = strings.TrimSpace(part)
		p, err := netip.ParsePrefix(part)
		if err != nil {
			a, aerr := netip.ParseAddr(part)
			if aerr != nil {
				return fmt.Errorf("not a network (CIDR) or address: %q", part)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		*l = append(*l, p.Masked())
	}
	return nil
}

func parseServe(args []string, stderr io.Writer) (*serveOpts, int, bool) {
	o := &serveOpts{}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	o.ef.register(fs, true)
	fs.Var(&o.exports, "export", "export a region (repeatable): `NAME=anon,size=N | NAME=file:PATH[,size=N][,ro] | NAME=shm:OBJ,size=N[,ro]`")
	fs.StringVar(&o.metrics, "metrics", "", "serve Prometheus /metrics on this `address` (e.g. 127.0.0.1:9479); empty disables")
	fs.StringVar(&o.perftestExp, "perftest-export", "", "`name` of the export perftest clients target (default: the first)")
	fs.IntVar(&o.gidx, "x", 0, "GID `index` put in perftest key messages")
	fs.IntVar(&o.mtu, "m", 0, "MTU in bytes offered to perftest clients (default: the port's active MTU)")
	fs.UintVar(&o.qpTimeout, "qp-timeout", 14, "RC local ACK timeout exponent of the daemon's QPs (1..31; 0, no timeout, is refused)")
	fs.DurationVar(&o.grace, "grace", 10*time.Second, "on SIGTERM/SIGINT, let running sessions finish for this long (0: end them at once)")
	fs.IntVar(&o.maxSessions, "max-sessions", 64, "concurrent perftest sessions")
	fs.StringVar(&o.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "log `format`: text or json")
	fs.StringVar(&o.config, "config", "", "read flags from `file` (lines \"name = value\", # comments); command-line flags win")
	fs.UintVar(&o.rdmaCMPort, "rdma-cm-port", 0, "also accept perftest -R (rdma_cm) clients on this rdma_cm `port` (perftest's is 18515; default 0: off)")
	fs.StringVar(&o.listen, "listen", "", "TCP `address` of the perftest exchange (default: every address, port -p); e.g. 10.0.0.1 or [::1]:18515")
	fs.Var(&o.allow, "allow", "only serve clients from this `network` (CIDR or address; repeatable; default: every address)")
	fs.StringVar(&o.token, "token", "", "require rxed clients to prove this shared `secret` (perftest clients cannot: they are refused)")
	fs.StringVar(&o.tokenFile, "token-file", "", "read the shared secret from `file` (trailing newline ignored)")
	fs.BoolVar(&o.allowUnverified, "allow-unverified-gid", false, "serve perftest clients whose key announces a GID other than their TCP address (perftest's IPv6 GID over an IPv4 exchange); such a client can aim the responses at a third party")
	fs.DurationVar(&o.handshake, "handshake-timeout", daemon.DefaultHandshakeTimeout, "a client must finish the exchange up to its run within this `duration`")
	fs.DurationVar(&o.idle, "idle-timeout", daemon.DefaultIdleTimeout, "end a session whose QPs received nothing for this `duration` (0: never)")
	fs.IntVar(&o.perSource, "max-sessions-per-source", 0, "concurrent sessions from one client address (0: --max-sessions)")
	fs.Var(&o.sessionBytes, "session-bytes", "stop sending to a session after this many `bytes` (e.g. 10G; default: no bound)")
	fs.Var(&o.maxRead, "max-read", "refuse RDMA READs longer than this many `bytes` (e.g. 1M; default: no bound)")
	rest, code, ok := parseArgs(fs, args, stderr)
	if !ok {
		return nil, code, false
	}
	bad := func(format string, a ...any) (*serveOpts, int, bool) {
		fmt.Fprintf(stderr, "rxed serve: "+format+"\n", a...)
		return nil, 2, false
	}
	if len(rest) > 0 {
		return bad("unexpected argument %q (serve takes flags only)", rest[0])
	}
	if o.config != "" {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if err := applyConfigFile(fs, o.config, set); err != nil {
			return bad("%v%s", err, pathHint(err, false))
		}
	}
	if err := o.ef.check(); err != nil {
		return bad("%v", err)
	}
	if o.mtu != 0 && oob.MTUEnum(o.mtu) == 0 {
		return bad("-m %d: want 256, 512, 1024, 2048 or 4096", o.mtu)
	}
	if o.qpTimeout < 1 || o.qpTimeout > 31 {
		// 0 is IBA's infinite timeout, which the daemon's Config would
		// take for its default (14): refused rather than changed.
		return bad("--qp-timeout %d: want 1..31 (0, no timeout, would let a vanished client hold its session's QP)", o.qpTimeout)
	}
	if _, err := o.ef.gid("-x", o.gidx); err != nil {
		return bad("%v", err)
	}
	if _, err := parseLevel(o.logLevel); err != nil {
		return bad("%v", err)
	}
	if o.logFormat != "text" && o.logFormat != "json" {
		return bad("--log-format %q: want text or json", o.logFormat)
	}
	if o.maxSessions < 1 {
		return bad("--max-sessions %d: want at least 1", o.maxSessions)
	}
	if o.perSource < 0 {
		return bad("--max-sessions-per-source %d: want 0 or more", o.perSource)
	}
	if o.handshake <= 0 {
		return bad("--handshake-timeout %v: want a positive duration", o.handshake)
	}
	if o.grace < 0 {
		return bad("--grace %v: want 0 (end running sessions at once) or a positive duration", o.grace)
	}
	if o.idle < 0 {
		return bad("--idle-timeout %v: want 0 (never) or a positive duration", o.idle)
	}
	for _, name := range []string{"session-bytes", "max-read"} {
		if f := fs.Lookup(name); flagSet(fs, name) && f.Value.String() == "0" {
			return bad("--%s %s: want a positive byte count such as 64M", name, f.Value)
		}
	}
	tok, err := readToken(o.token, o.tokenFile)
	if err != nil {
		return bad("%v%s", err, pathHint(err, false))
	}
	o.tokenBytes = tok
	if o.rdmaCMPort > 65535 {
		return bad("--rdma-cm-port %d out of range 0..65535", o.rdmaCMPort)
	}
	if o.rdmaCMPort != 0 && len(tok) > 0 {
		return bad("--rdma-cm-port: token mode covers the TCP exchange only (perftest -R clients cannot prove a token)")
	}
	if o.listen != "" {
		if _, err := o.listenAddr(); err != nil {
			return bad("%v", err)
		}
	}
	if o.metrics != "" {
		// Checked here: the daemon's listen error for it named no address
		// ("listen %!s(<nil>): address x: missing port in address").
		if _, _, err := net.SplitHostPort(o.metrics); err != nil {
			return bad("--metrics %q: want HOST:PORT, e.g. 127.0.0.1:9479 (%v)", o.metrics, err)
		}
	}
	names := map[string]bool{}
	for _, e := range o.exports {
		if names[e.Name] {
			return bad("--export: export %s given twice", e.Name)
		}
		names[e.Name] = true
	}
	if o.perftestExp != "" && !names[o.perftestExp] {
		return bad("--perftest-export %q: no export has that name", o.perftestExp)
	}
	if len(o.exports) == 0 && o.ef.oobPort != 0 {
		return bad("perftest clients need an export to target (give --export, or -p 0 for no perftest exchange)")
	}
	if len(o.exports) == 0 && o.rdmaCMPort != 0 {
		return bad("--rdma-cm-port: perftest -R clients need an export to target (give --export)")
	}
	return o, 0, true
}

// applyConfigFile sets every flag the file names unless the command line
// set it already. Each line is "name = value", "name value" or "name"
// (booleans); blank lines and lines starting with # are skipped.
func applyConfigFile(fs *flag.FlagSet, path string, cliSet map[string]bool) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, val, hasVal := strings.Cut(line, "=")
		if !hasVal {
			name, val, hasVal = strings.Cut(line, " ")
		}
		name, val = strings.TrimLeft(strings.TrimSpace(name), "-"), strings.TrimSpace(val)
		if name == "config" {
			return fmt.Errorf("config %s line %d: config files do not nest", path, n)
		}
		fl := fs.Lookup(name)
		if fl == nil {
			return fmt.Errorf("config %s line %d: unknown setting %q", path, n, name)
		}
		if cliSet[name] {
			continue
		}
		if !hasVal {
			val = "true"
		}
		if err := fs.Set(name, strings.Trim(val, `"`)); err != nil {
			return fmt.Errorf("config %s line %d: %s: %v", path, n, name, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("config %s: %v", path, err)
	}
	return nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

func runServe(args []string, stdout, stderr io.Writer) int {
	o, code, ok := parseServe(args, stderr)
	if !ok {
		return code
	}
	// SIGTERM and SIGINT cancel the context: the daemon stops accepting,
	// finishes what runs, msyncs and exits 0.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := serve(ctx, o, stderr, nil); err != nil {
		return failHint(stderr, "serve", err, serveNextStep(err))
	}
	return 0
}

// serve runs the daemon until ctx ends; ready (if not nil) is called once
// it listens.
func serve(ctx context.Context, o *serveOpts, logOut io.Writer, ready func(*daemon.Daemon)) error {
	lvl, _ := parseLevel(o.logLevel)
	if o.ef.verbose {
		lvl = slog.LevelDebug
	}
	hopts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler = slog.NewTextHandler(logOut, hopts)
	if o.logFormat == "json" {
		h = slog.NewJSONHandler(logOut, hopts)
	}
	log := slog.New(h)
	dc, pcapFile, err := o.ef.deviceConfig(log)
	if err != nil {
		return err
	}
	if pcapFile != nil {
		defer pcapFile.Close()
	}
	cfg := daemon.Config{Addrs: dc.Addrs, Port: dc.Port, Fault: dc.Fault, Pcap: dc.Pcap, MetricsAddr: o.metrics, Exports: o.exports,
		PerftestExport: o.perftestExp, GIDIndex: o.gidx, MTU: oob.MTUEnum(o.mtu), QPTimeout: uint8(o.qpTimeout),
		StepTimeout: o.ef.timeout, ShutdownGrace: o.grace, MaxSessions: o.maxSessions, Logger: log}
	cfg.Allow, cfg.Token, cfg.AllowUnverifiedGID = o.allow, o.tokenBytes, o.allowUnverified
	cfg.HandshakeTimeout, cfg.IdleTimeout, cfg.MaxSessionsPerSource = o.handshake, o.idle, o.perSource
	if o.idle == 0 {
		cfg.IdleTimeout = -1 // never
	}
	if o.grace == 0 {
		cfg.ShutdownGrace = -1 // none (the daemon's 0 is its default)
	}
	cfg.SessionBytes, cfg.MaxReadLen = int64(o.sessionBytes), int64(o.maxRead)
	cfg.RDMACMPort = uint16(o.rdmaCMPort)
	if o.ef.oobPort != 0 {
		cfg.OOBAddr, _ = o.listenAddr()
	}
	d, err := daemon.New(cfg)
	if err != nil {
		return err
	}
	if ready != nil {
		ready(d)
	}
	err = d.Run(ctx)
	if o.ef.countersOut != "" {
		// The engine is stopped; its counters keep their final values.
		if werr := writeCountersJSON(o.ef.countersOut, d.Device().Counters()); err == nil {
			err = werr
		}
	}
	return err
}

// listenAddr is the exchange's TCP listen address (listenAddress).
func (o *serveOpts) listenAddr() (string, error) { return listenAddress(o.listen, o.ef.oobPort) }
