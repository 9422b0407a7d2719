package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/rxed/rxed/pkg/conform"
)

func init() {
	register(&command{
		name:    "conform",
		summary: "RoCEv2 conformance suite against a peer reached through its own tool (ib_*_bw, ibv_*_pingpong)",
		run:     runConform,
	})
}

type conformOpts struct {
	ef       engineFlags
	tool     string
	gidx     int
	serve    bool
	list     bool
	run      string
	json     bool
	pcapDir  string
	report   string
	verbose  bool
	mtu      int
	iters    int
	size     int
	peerTO   uint
	peerRtry int
	peerRNR  int
	peer     netip.Addr
}

func parseConform(args []string, stderr io.Writer) (*conformOpts, int, bool) {
	o := &conformOpts{}
	bad := func(format string, a ...any) (*conformOpts, int, bool) {
		fmt.Fprintf(stderr, "rxed conform: "+format+"\n", a...)
		return nil, 2, false
	}
	fs := flag.NewFlagSet("conform", flag.ContinueOnError)
	o.ef.register(fs, true)
	// --timeout bounds each scenario here, not one exchange step.
	o.ef.timeout = 10 * time.Second
	if f := fs.Lookup("timeout"); f != nil {
		f.DefValue, f.Usage = "10s", "bound each scenario (connection, packets, closing exchange) by this `duration`"
	}
	fs.StringVar(&o.tool, "tool", "", "the peer's `tool`: ib_write_bw, ib_read_bw, ib_atomic_bw, ib_send_bw, ibv_rc_pingpong or ibv_ud_pingpong")
	fs.IntVar(&o.gidx, "x", 0, "local GID `index` (index into the --addr list)")
	fs.BoolVar(&o.serve, "serve", false, "play the tool's server: the peer's client connects to us (peer-as-requester scenarios)")
	fs.BoolVar(&o.list, "list", false, "list every scenario with its rule and exit")
	fs.StringVar(&o.run, "run", "", "run only scenarios whose ID matches this `regexp`")
	fs.BoolVar(&o.json, "json", false, "print the results as JSON records instead of a table")
	fs.StringVar(&o.pcapDir, "pcap-dir", "", "write one capture per scenario into `dir` (ID.pcap)")
	fs.StringVar(&o.report, "report", "", "write a self-contained HTML report with ladder diagrams to `file`")
	fs.BoolVar(&o.verbose, "v", false, "print each scenario's packet ladder as text")
	fs.IntVar(&o.mtu, "m", 1024, "path MTU in bytes to ask the peer for")
	fs.IntVar(&o.iters, "peer-iters", 1000, "the peer tool's -n (send and pingpong tools finish after that many messages)")
	fs.IntVar(&o.size, "peer-size", 0, "ib_send_bw: the peer tool's -s; every SEND then has exactly this size (0: scenarios choose)")
	fs.UintVar(&o.peerTO, "peer-timeout", 14, "requester scenarios: the peer's local ACK timeout exponent")
	fs.IntVar(&o.peerRtry, "peer-retry", 7, "requester scenarios: the peer's retry count (retry_cnt)")
	fs.IntVar(&o.peerRNR, "peer-rnr-retry", 7, "requester scenarios: the peer's rnr_retry (7: infinite)")
	rest, code, ok := parseArgs(fs, args, stderr)
	if !ok {
		return nil, code, false
	}
	if o.list {
		return o, 0, true
	}
	if o.tool == "" {
		return bad("--tool is required")
	}
	if _, err := conform.ParseTool(o.tool); err != nil {
		return bad("--tool: %v", err)
	}
	if err := o.ef.check(); err != nil {
		return bad("%v", err)
	}
	if _, err := o.ef.gid("-x", o.gidx); err != nil {
		return bad("%v", err)
	}
	if o.ef.fault != "" || o.ef.pcap != "" {
		return bad("--fault and --pcap do not apply to conform (the engine crafts every packet; use --pcap-dir)")
	}
	switch {
	case o.serve && len(rest) > 0:
		return bad("--serve takes no peer address: the peer's client connects to us")
	case !o.serve && len(rest) != 1:
		return bad("want exactly one PEER_ADDR (the address of the peer's %s server), got %q", o.tool, rest)
	}
	if !o.serve {
		a, err := netip.ParseAddr(rest[0])
		if err != nil {
			return bad("PEER_ADDR %q is not an IP address", rest[0])
		}
		o.peer = a.Unmap()
	}
	if o.run != "" {
		if _, err := regexp.Compile(o.run); err != nil {
			return bad("-run: %v", err)
		}
	}
	if oobMTU := o.mtu; oobMTU != 256 && oobMTU != 512 && oobMTU != 1024 && oobMTU != 2048 && oobMTU != 4096 {
		return bad("-m %d: want 256, 512, 1024, 2048 or 4096", o.mtu)
	}
	if o.iters < 1 {
		return bad("--peer-iters %d: must be positive", o.iters)
	}
	if o.peerRtry < 1 || o.peerRtry > 7 {
		return bad("--peer-retry %d: want 1..7", o.peerRtry)
	}
	if o.peerRNR < 0 || o.peerRNR > 7 {
		return bad("--peer-rnr-retry %d: want 0..7", o.peerRNR)
	}
	if o.peerTO > 31 {
		return bad("--peer-timeout %d: want 0..31", o.peerTO)
	}
	return o, 0, true
}

func runConform(args []string, stdout, stderr io.Writer) int {
	o, code, ok := parseConform(args, stderr)
	if !ok {
		return code
	}
	var re *regexp.Regexp
	if o.run != "" {
		re = regexp.MustCompile(o.run)
	}
	scenarios := conform.Select(re)
	if o.list {
		for _, s := range scenarios {
			fmt.Fprintf(stdout, "%-22s %-9s %s\n  rule: %s\n  expect: %s\n  tools: %s\n", s.ID, s.Role, s.Title, s.Rule, s.Expect, toolNames(s.Tools))
		}
		return 0
	}
	if len(scenarios) == 0 {
		fmt.Fprintf(stderr, "rxed conform: -run %q matches no scenario\n", o.run)
		return 2
	}
	tool, _ := conform.ParseTool(o.tool)
	local, _ := o.ef.gid("-x", o.gidx)
	cfg := conform.Config{Tool: tool, Local: local, Peer: o.peer, OOBPort: uint16(o.ef.oobPort), RoCEPort: uint16(o.ef.port),
		Serve: o.serve, Timeout: o.ef.timeout, MTU: o.mtu, PeerIters: o.iters, SendSize: o.size, PeerACKTimeout: uint8(o.peerTO),
		PeerRetry: o.peerRtry, PeerRNRRetry: o.peerRNR, PeerRNRRetrySet: true, Logger: o.ef.logger(stderr)}
	fs := flagsSet(args)
	cfg.PeerParamsSet = fs["peer-timeout"] || fs["peer-retry"] || fs["peer-rnr-retry"]
	if o.pcapDir != "" {
		if err := os.MkdirAll(o.pcapDir, 0o755); err != nil {
			return fail(stderr, "conform", fmt.Errorf("--pcap-dir: %v", err))
		}
	}
	if o.serve {
		fmt.Fprintf(stderr, "rxed conform: start the peer as: %s\n", tool.PeerCommand(true, local.String(), o.iters))
	}
	if !o.json {
		fmt.Fprintf(stdout, "%-22s %-9s %s\n", "ID", "VERDICT", "EVIDENCE")
	}
	var enc *json.Encoder
	if o.json {
		enc = json.NewEncoder(stdout)
	}
	counts := map[conform.Verdict]int{}
	results := conform.RunAll(context.Background(), cfg, scenarios, func(r conform.Result) {
		counts[r.Verdict]++
		if o.json {
			_ = enc.Encode(r)
		} else {
			fmt.Fprintf(stdout, "%-22s %-9s %s\n", r.ID, r.Verdict, oneLine(r.Evidence))
		}
		if o.verbose && len(r.Trace) > 0 {
			_ = conform.WriteLadder(stdout, r)
		}
		if o.pcapDir != "" && len(r.Trace) > 0 {
			if err := writePcapFile(filepath.Join(o.pcapDir, r.ID+".pcap"), r); err != nil {
				fmt.Fprintf(stderr, "rxed conform: %v\n", err)
			}
		}
	})
	if !o.json {
		fmt.Fprintf(stdout, "%d scenarios: %d PASS, %d FAIL, %d DEVIATION, %d SKIP, %d ERROR\n", len(results),
			counts[conform.Pass], counts[conform.Fail], counts[conform.Deviation], counts[conform.Skip], counts[conform.Error])
	}
	if id, n, ok := peerLostAfter(results); ok {
		fmt.Fprintf(stderr, "rxed conform: the peer stopped answering in %s and none of the %d scenarios after it found the peer: "+
			"its host may have crashed (a malformed packet can panic a kernel: check its console); they did not test it\n", id, n)
	}
	if o.report != "" {
		if err := writeReport(o.report, fmt.Sprintf("rxed conform: %s at %s", tool, o.peer), results); err != nil {
			return fail(stderr, "conform", err)
		}
	}
	if counts[conform.Fail] > 0 || counts[conform.Error] > 0 {
		return 1
	}
	return 0
}

// peerLostAfter recognises a peer that died during a run: the run ends in scenarios that all
// ERRORed at setup (no tool server, no route), at least two after the one the peer was lost
// in. That one is the scenario before them when it FAILed (its probe went unanswered), or the
// first of them when the one before PASSed (the peer died as it began). It returns the
// scenario and how many came after it.
func peerLostAfter(results []conform.Result) (id string, after int, ok bool) {
	i := len(results)
	for i > 0 && results[i-1].Verdict == conform.Error && strings.HasPrefix(results[i-1].Evidence, "setup:") {
		i--
	}
	if i == 0 || i == len(results) { // never reached a peer, or the last one answered
		return "", 0, false
	}
	lost := i - 1
	if v := results[lost].Verdict; v != conform.Fail && v != conform.Error {
		lost = i
	}
	if after = len(results) - lost - 1; after < 2 {
		return "", 0, false
	}
	return results[lost].ID, after, true
}

// flagsSet names the flags given on the command line (either dash form,
// with or without =value).
func flagsSet(args []string) map[string]bool {
	m := map[string]bool{}
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		a = strings.TrimLeft(a, "-")
		if i := strings.IndexByte(a, '='); i >= 0 {
			a = a[:i]
		}
		m[a] = true
	}
	return m
}

func toolNames(ts []conform.Tool) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = string(t)
	}
	return strings.Join(s, ", ")
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

func writePcapFile(path string, r conform.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--pcap-dir: %v", err)
	}
	if err := conform.WritePcap(f, r); err != nil {
		f.Close()
		return fmt.Errorf("--pcap-dir: %s: %v", path, err)
	}
	return f.Close()
}

func writeReport(path, title string, results []conform.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--report: %v", err)
	}
	if err := conform.WriteHTML(f, title, results); err != nil {
		f.Close()
		return fmt.Errorf("--report: %v", err)
	}
	return f.Close()
}
