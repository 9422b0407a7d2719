//go:build linux

// Command interop runs the rxed <-> rdma_rxe interop matrix (see test/interop/README.md):
// builds or reuses the guest image, creates the rxedlab network namespace, boots the rxe
// guest(s), checks the plumbing with hostsmoke, runs every cell in both directions, writes
// RESULTS.md and tears everything down (also on failure, timeout or SIGINT/SIGTERM).
//
//	go run ./test/interop/cmd/interop                      # rxed against one rxe guest
//	go run ./test/interop/cmd/interop -subject rxe         # rxe against rxe (harness self-check)
//	go run ./test/interop/cmd/interop -cells rc_pingpong,loss
//
// Needs Linux and root. Without them (or without qemu/debootstrap after trying to install
// them) it skips with a message, or fails when CI=true.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rxed/rxed/pkg/conform"
	"github.com/rxed/rxed/test/interop"
)

func main() {
	os.Exit(run())
}

type options struct {
	subject interop.Subject
	cells   string
	dirs    string
	dir     string // test/interop
	results string
	cache   string
	timeout time.Duration
	memMB   int
	rxed    string // prebuilt rxed binary (default: go build ./cmd/rxed)
	smoke   bool   // stop after the host smoke check
	conform bool   // run the conformance part (rxed conform against the guest's tools)
	confRes string // its results file
	crash   string // crash the guest before the first run of this cell (checks the recovery)
	freeze  string // freeze the guest a few seconds into this conform run (checks the recovery)

	// the fabric cells selected (rxed hosts in namespaces of their own beside the guest, fabric.go)
	fabric []interop.Cell
}

func run() int {
	var o options
	subject := flag.String("subject", envOr("RXED_INTEROP_SUBJECT", "rxed"), "implementation under test: rxed, or rxe (a second guest; checks the harness)")
	flag.StringVar(&o.cells, "cells", os.Getenv("RXED_INTEROP_CELLS"), "comma-separated substrings of cell names to run (default all)")
	flag.StringVar(&o.dirs, "dirs", envOr("RXED_INTEROP_DIRS", "both"), "directions: both, srv (subject is server) or cli")
	flag.StringVar(&o.dir, "dir", "test/interop", "the harness directory (build.sh, guest/)")
	flag.StringVar(&o.results, "results", "", "results file (default <dir>/RESULTS.md, or <dir>/RESULTS-rxe.md for -subject rxe)")
	flag.StringVar(&o.cache, "cache", envOr("RXED_INTEROP_CACHE", "/var/tmp/rxed-interop"), "cache for the guest image and run state")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up (and tear down) after this long")
	flag.IntVar(&o.memMB, "mem", 768, "guest memory in MiB")
	flag.StringVar(&o.rxed, "rxed", os.Getenv("RXED_INTEROP_RXED"), "use this rxed binary instead of building ./cmd/rxed")
	flag.BoolVar(&o.smoke, "smoke", false, "only build, boot one guest and run the host smoke check (namespace plumbing)")
	flag.BoolVar(&o.conform, "conform", envOr("RXED_INTEROP_CONFORM", "1") == "1", "also run the conformance part (rxed conform against the guest's tools; rxed subject only)")
	flag.StringVar(&o.confRes, "conform-results", "", "conformance results file (default <dir>/CONFORMANCE.md)")
	flag.StringVar(&o.freeze, "freeze-guest", os.Getenv("RXED_INTEROP_FREEZE_GUEST"), "check the harness: stop the guest's qemu (SIGSTOP, a hang without a panic) a few seconds into the first conform run whose name contains this; the harness must reboot it and run it again")
	flag.StringVar(&o.crash, "crash-guest", os.Getenv("RXED_INTEROP_CRASH_GUEST"), "check the harness: crash the guest's kernel (sysrq c) before the first run of the first cell whose name contains this; the harness must reboot it and run the cell again")
	list := flag.Bool("list", false, "print the matrix and the command lines, then exit")
	flag.Parse()
	o.subject = interop.Subject(*subject)
	if o.subject != interop.SubjectRxed && o.subject != interop.SubjectRxe {
		fmt.Fprintf(os.Stderr, "interop: -subject %q: want rxed or rxe\n", *subject)
		return 2
	}
	if o.results == "" {
		o.results = filepath.Join(o.dir, "RESULTS.md")
		if o.subject == interop.SubjectRxe {
			o.results = filepath.Join(o.dir, "RESULTS-rxe.md")
		}
	}
	if o.confRes == "" {
		o.confRes = filepath.Join(o.dir, "CONFORMANCE.md")
	}
	cells := interop.Select(interop.Matrix(), o.cells)
	o.fabric = interop.Select(interop.FabricCells(), o.cells)
	var conf []interop.ConformRun
	if o.conform && o.subject == interop.SubjectRxed {
		conf = interop.SelectConform(interop.ConformRuns(), o.cells)
	}
	if len(cells) == 0 && len(conf) == 0 && len(o.fabric) == 0 {
		fmt.Fprintf(os.Stderr, "interop: no cell matches %q\n", o.cells)
		return 2
	}
	if *list {
		printMatrix(cells)
		printConform(conf)
		return 0
	}
	if msg := preconditions(); msg != "" {
		return skipOrFail(msg)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	return runMatrix(ctx, o, cells, conf)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func preconditions() string {
	if runtime.GOOS != "linux" {
		return "interop: needs Linux (network namespaces, qemu, rdma_rxe guests); this is " + runtime.GOOS
	}
	if os.Geteuid() != 0 {
		return "interop: needs root (network namespace, taps, debootstrap); run `sudo make interop`"
	}
	return ""
}

// skipOrFail: a missing precondition fails the run under CI=true and skips it otherwise.
func skipOrFail(msg string) int {
	if os.Getenv("CI") == "true" {
		fmt.Fprintln(os.Stderr, "FAIL:", msg, "(CI=true: the interop suite must run)")
		return 1
	}
	fmt.Println("SKIP:", msg)
	return 0
}

// printCM prints an rdma_cm cell's four command lines (rxed at 10.78.0.1, the guest at
// 10.78.0.11, or fd78::1 / fd78::11).
func printCM(c interop.Cell) {
	rxed, guest := interop.HostIP, "10.78.0.11"
	if c.IPv6 {
		rxed, guest = interop.HostIP6, "fd78::11"
	}
	port := 20000
	if c.CM.Port != 0 {
		port = c.CM.Port
	}
	v := func(addr, srv string) interop.CMVars {
		return interop.CMVars{Rxed: "rxed", Addr: addr, SrvAddr: srv, Port: port, Counters: "C.json", Pcap: "P.pcap"}
	}
	fmt.Printf("%s (%d client run(s))\n", c.Name, len(c.CM.Steps))
	fmt.Printf("  rxe  server: %s\n  rxed client: %s\n", interop.RenderCM(c.CM.RxeServer, v(guest, guest)), interop.RenderCM(c.CM.RxedClient, v(rxed, guest)))
	fmt.Printf("  rxed server: %s\n  rxe  client: %s\n", interop.RenderCM(c.CM.RxedServer, v(rxed, rxed)), interop.RenderCM(c.CM.RxeClient, v(guest, rxed)))
}

// printMcast prints a multicast cell's members (rxed at 10.78.0.1-3, the guest at 10.78.0.11).
func printMcast(c interop.Cell) {
	fmt.Printf("%s (one run)\n", c.Name)
	for _, m := range c.Mcast.Members {
		who, v := "rxe ", interop.McastVars{Addr: "10.78.0.11", Group: c.Mcast.Group}
		if m.Rxed {
			who, v = "rxed", interop.McastVars{Rxed: "rxed", Addr: interop.HostIP, Group: c.Mcast.Group, Counters: "C.json", Pcap: "P.pcap"}
		}
		role := "receiver"
		if m.Sender {
			role = "sender  "
		}
		fmt.Printf("  %s %s: %s\n", who, role, interop.RenderMcast(m.Cmd, v))
	}
}

func printMatrix(cells []interop.Cell) {
	runs := 0
	for _, c := range cells {
		if c.CM != nil {
			printCM(c)
			runs += 2
			continue
		}
		if c.Mcast != nil {
			printMcast(c)
			runs++
			continue
		}
		t := interop.Tools[c.Tool]
		v := interop.Vars{Rxed: "rxed", Addr: interop.HostIP, GID: 1, Port: 20000, Counters: "C.json"}
		if c.IPv6 {
			v.Addr, v.GID = interop.HostIP6, 2
		}
		v.Export = "EXPORT.img"
		rxed := t.Rxed
		if c.Serve {
			rxed = interop.ServeRxed
			if interop.IsRDMACMPerf(c) {
				rxed = interop.ServeRxedRDMACM
			}
		}
		fmt.Printf("%s\n  rxe : %s\n  rxed: %s\n", c.Name, interop.Render(t.Rxe, c, v), interop.Render(rxed, c, v))
		if c.TOS != 0 {
			fmt.Printf("  (rxed also --pcap P.pcap; the wire captured on the guest's tap)\n")
		}
		if c.ClientArgs != "" {
			fmt.Printf("  (client only: %s)\n", c.ClientArgs)
		}
		if c.Runs(interop.SubjectRxed, interop.SubjectServer) {
			runs++
		}
		if c.Runs(interop.SubjectRxed, interop.SubjectClient) {
			runs++
		}
	}
	fmt.Printf("%d cells, %d runs (rxed subject)\n", len(cells), runs)
}

func runMatrix(ctx context.Context, o options, cells []interop.Cell, conf []interop.ConformRun) int {
	started := time.Now()
	info := interop.RunInfo{Subject: o.subject, Started: started}

	// one run at a time: a second one would delete the first one's namespace
	if err := os.MkdirAll(o.cache, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	lock, err := os.OpenFile(filepath.Join(o.cache, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: another interop run holds %s (%v)\n", lock.Name(), err)
		return 1
	}

	// 1. guest image (build.sh also installs missing host packages)
	t := time.Now()
	img, err := buildImage(ctx, o.dir, o.cache)
	if err != nil {
		if missing := missingTools(); missing != "" {
			return skipOrFail("interop: " + missing + " not available (apt-get install failed?): " + err.Error())
		}
		fmt.Fprintln(os.Stderr, "FAIL: guest image:", err)
		return 1
	}
	info.BuildTime = time.Since(t)
	if k, err := os.ReadFile(filepath.Join(img, "KVER")); err == nil {
		info.Kernel = strings.TrimSpace(string(k))
	}
	if missing := missingTools(); missing != "" {
		return skipOrFail("interop: " + missing + " not available")
	}

	// 2. host programs
	bin, err := os.MkdirTemp("", "rxed-interop-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(bin)
	gobin := envOr("GO", "go")
	targets := map[string]string{"hostsmoke": "./test/interop/cmd/hostsmoke"}
	rxedBin := filepath.Join(bin, "rxed")
	if o.subject == interop.SubjectRxed && !o.smoke {
		if o.rxed != "" {
			if rxedBin, err = filepath.Abs(o.rxed); err != nil {
				fmt.Fprintln(os.Stderr, "FAIL:", err)
				return 1
			}
		} else {
			targets["rxed"] = "./cmd/rxed"
		}
	}
	for name, pkg := range targets {
		if out, err := exec.CommandContext(ctx, gobin, "build", "-o", filepath.Join(bin, name), pkg).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: go build %s: %v\n%s", pkg, err, out)
			return 1
		}
	}

	// 3. namespace + guests; torn down whatever happens from here on
	lab := &interop.Lab{Img: img, Cache: o.cache, Accel: interop.PickAccel(), MemMB: o.memMB, Log: os.Stdout}
	info.Accel = lab.Accel
	defer lab.Teardown()
	go func() { <-ctx.Done(); lab.Teardown() }() // a signal or the timeout: stop guests now
	nvm := 1
	if o.subject == interop.SubjectRxe && !o.smoke {
		nvm = 2
	}
	if err := lab.SetupNet(ctx, nvm); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: network namespace:", err)
		return 1
	}
	t = time.Now()
	if err := lab.Boot(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: boot:", err)
		return 1
	}
	info.BootTime = time.Since(t)

	// 4. plumbing check: a host-side program on 10.78.0.1 receives the guest kernel's RoCE packets
	t = time.Now()
	if err := hostSmoke(ctx, lab, filepath.Join(bin, "hostsmoke")); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: host smoke:", err)
		return 1
	}
	info.SmokeTime = time.Since(t)
	if o.smoke {
		fmt.Printf("interop: smoke OK (build %.1fs, boot %.1fs, smoke %.1fs)\n", info.BuildTime.Seconds(), info.BootTime.Seconds(), info.SmokeTime.Seconds())
		return 0
	}

	// 5. the matrix
	logDir := filepath.Join(o.cache, "logs", started.UTC().Format("20060102-150405")+"-"+string(o.subject))
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	strict := lab.Accel == "kvm"
	if v := os.Getenv("RXED_INTEROP_STRICT"); v != "" {
		strict = v == "1"
	}
	info.Strict = strict
	r := &interop.Runner{Lab: lab, Subject: o.subject, Rxed: rxedBin, LogDir: logDir, Strict: strict, CrashGuest: o.crash, FreezeGuest: o.freeze}
	var results []interop.Result
	dirs := []interop.Direction{interop.SubjectServer, interop.SubjectClient}
	switch o.dirs {
	case "srv":
		dirs = dirs[:1]
	case "cli":
		dirs = dirs[1:]
	}
	for _, c := range cells {
		if ctx.Err() != nil {
			break
		}
		if err := setMTU(ctx, r, &info, linkMTU(c.MTU)); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL: MTU:", err)
			break
		}
		for _, d := range dirs {
			if ctx.Err() != nil {
				break
			}
			if !c.Runs(o.subject, d) {
				continue
			}
			res := r.RunRecovering(ctx, c, d)
			results = append(results, res)
			st := "PASS"
			if !res.Pass {
				st = "FAIL " + strings.Join(res.Problems, "; ")
			}
			if len(res.Notes) > 0 {
				st += " (" + strings.Join(res.Notes, ", ") + ")"
			}
			fmt.Printf("%-28s %s %5.1fs %-30s %s\n", c.Name, d.Short(), res.Elapsed.Seconds(), res.Metric, st)
		}
	}
	if len(o.fabric) > 0 && ctx.Err() == nil {
		recoverGuests(ctx, r, &info, "the fabric cells")
	}
	for _, res := range r.RunFabric(ctx, o.fabric) {
		results = append(results, res)
		fmt.Println(interop.FabricLine(res))
	}
	if len(conf) > 0 && ctx.Err() == nil {
		recoverGuests(ctx, r, &info, "the conformance part")
	}
	confBroken := runConform(ctx, o, r, info, conf)
	info.Total = time.Since(started)
	if o.subject == interop.SubjectRxed {
		rev, _ := exec.Command("git", "describe", "--always", "--dirty").Output()
		what := "built from ./cmd/rxed at " + strings.TrimSpace(string(rev))
		if o.rxed != "" {
			what = "prebuilt binary " + o.rxed + " (tree at " + strings.TrimSpace(string(rev)) + ")"
		}
		info.Note = strings.TrimSpace(info.Note + " rxed: " + what + ";")
	}
	if ctx.Err() != nil {
		info.Note = strings.TrimSpace(info.Note + " run interrupted: " + context.Cause(ctx).Error() + ";")
	}
	info.Note = strings.TrimSpace(info.Note + " logs: " + logDir)

	if len(results) == 0 {
		// a conformance-only run (-cells conform): RESULTS.md keeps the last matrix run
		if confBroken > 0 || ctx.Err() != nil {
			return 1
		}
		return 0
	}
	interop.LossRatios(results)
	var buf bytes.Buffer
	interop.WriteReport(&buf, info, results)
	if err := os.WriteFile(o.results, buf.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "interop: writing results:", err)
	}
	fmt.Println()
	os.Stdout.Write(buf.Bytes())
	pass, fail := interop.Summary(results)
	fmt.Printf("\ninterop: %d passed, %d failed (%s)\n", pass, fail, o.results)
	if n := interop.DownCount(results); n > 0 {
		fmt.Printf("interop: a guest went down %d time(s) and was rebooted (see \"Guests that went down\" in %s)\n", n, o.results)
	}
	if fail > 0 || confBroken > 0 || ctx.Err() != nil {
		return 1
	}
	return 0
}

// runConform runs the conformance part at link MTU 1500 (rxe active_mtu 1024) and writes
// CONFORMANCE.md; it returns how many conform runs broke (rxe's verdicts never count).
func runConform(ctx context.Context, o options, r *interop.Runner, info interop.RunInfo, conf []interop.ConformRun) int {
	if len(conf) == 0 || ctx.Err() != nil {
		return 0
	}
	if err := r.Lab.SetMTU(ctx, 1500); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: MTU:", err)
		return 1
	}
	var rs []interop.ConformResult
	for _, c := range conf {
		if ctx.Err() != nil {
			break
		}
		res := r.RunConformRecovering(ctx, c)
		rs = append(rs, res)
		n := res.Counts()
		st := "ok"
		if !res.OK() {
			st = "BROKE " + strings.Join(res.Problems, "; ")
		}
		fmt.Printf("%-28s %5.1fs %d PASS, %d FAIL, %d DEVIATION, %d SKIP, %d ERROR: %s\n", c.Name, res.Elapsed.Seconds(),
			n[conform.Pass], n[conform.Fail], n[conform.Deviation], n[conform.Skip], n[conform.Error], st)
	}
	rev, _ := exec.Command("git", "describe", "--always", "--dirty").Output()
	info.Note = "rxed at " + strings.TrimSpace(string(rev)) + "; logs, captures and HTML ladders: " + r.LogDir
	var buf bytes.Buffer
	interop.WriteConformReport(&buf, info, rs)
	if err := os.WriteFile(o.confRes, buf.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "interop: writing conformance results:", err)
	}
	ok, broken := interop.ConformSummary(rs)
	fmt.Printf("\ninterop: conformance: %d runs held, %d broke (%s)\n", ok, broken, o.confRes)
	if n := interop.DownCount(rs); n > 0 {
		fmt.Printf("interop: conformance: a guest went down %d time(s) without a panic and was rebooted (see the runs' notes in %s)\n", n, o.confRes)
	}
	if ctx.Err() != nil && len(rs) < len(conf) {
		broken++
	}
	return broken
}

func printConform(conf []interop.ConformRun) {
	n := 0
	for _, c := range conf {
		fmt.Printf("%s (%d scenarios)\n  guest: %s\n  host : rxed %s\n", c.Name, len(c.Scenarios()),
			c.GuestLoop(1, 20000, "PIDFILE"), strings.Join(c.RunArgs(20000, "PCAPS", "REPORT.html", "10.78.0.11"), " "))
		n += len(c.Scenarios())
	}
	if len(conf) > 0 {
		fmt.Printf("%d conform runs, %d scenario runs\n", len(conf), n)
	}
}

// setMTU sets the lab's MTU; if that fails because a guest went down (between cells, or at
// the very end of a passing run), the guest is rebooted and the MTU set once more.
func setMTU(ctx context.Context, r *interop.Runner, info *interop.RunInfo, mtu int) error {
	err := r.Lab.SetMTU(ctx, mtu)
	if err == nil || ctx.Err() != nil {
		return err
	}
	if !recoverGuests(ctx, r, info, fmt.Sprintf("setting MTU %d", mtu)) {
		return err
	}
	return r.Lab.SetMTU(ctx, mtu)
}

// recoverGuests reboots every guest found down before a stage (RecoverGuests) and says so on
// stdout and in the report's notes. It reports whether any was down.
func recoverGuests(ctx context.Context, r *interop.Runner, info *interop.RunInfo, stage string) bool {
	down := r.RecoverGuests(ctx, filepath.Join(r.LogDir, strings.ReplaceAll(stage, " ", "_")))
	for _, g := range down {
		msg := fmt.Sprintf("guest %d was down before %s (%s; console %s), rebooted", g.VM, stage, g.Short(), g.Console)
		if g.Reboot != "" {
			msg += " but did not come up: " + g.Reboot
		}
		fmt.Println("interop:", msg)
		info.Note = strings.TrimSpace(info.Note + " " + msg + ";")
	}
	return len(down) > 0
}

func linkMTU(ibMTU int) int {
	if ibMTU > 1024 {
		return 9000
	}
	return 1500
}

func missingTools() string {
	var m []string
	for _, t := range []string{"qemu-system-x86_64", "qemu-img", "debootstrap", "ssh", "tc"} {
		if _, err := exec.LookPath(t); err != nil {
			m = append(m, t)
		}
	}
	return strings.Join(m, ", ")
}

// buildImage runs build.sh, streaming its progress, and returns the image directory it prints.
func buildImage(ctx context.Context, dir, cache string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(dir, "build.sh"))
	cmd.Env = append(os.Environ(), "RXED_INTEROP_CACHE="+cache)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	img := ""
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		l := sc.Text()
		if v, ok := strings.CutPrefix(l, "IMG="); ok {
			img = v
		} else {
			fmt.Println(l)
		}
	}
	if err := cmd.Wait(); err != nil {
		return "", fmt.Errorf("build.sh: %w", err)
	}
	if img == "" {
		return "", errors.New("build.sh printed no IMG=")
	}
	return img, nil
}

// hostSmoke runs cmd/hostsmoke on the host side while guest 1's ibv_rc_pingpong talks to it.
func hostSmoke(ctx context.Context, lab *interop.Lab, bin string) error {
	const port = 18514
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", interop.Netns, bin, "-addr", interop.HostIP,
		"-port", fmt.Sprint(port), "-timeout", "60s")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out := &lockedBuf{}
	cmd.Stdout, cmd.Stderr = io.MultiWriter(out, os.Stdout), io.MultiWriter(out, os.Stdout)
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for !out.contains("listening") {
		select {
		case err := <-done:
			return fmt.Errorf("hostsmoke exited early: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	vm := lab.VMs[0]
	g, _ := lab.Guest(ctx, vm, fmt.Sprintf("timeout 8 ibv_rc_pingpong -d rxe0 -g %d -s 64 -n 1 -p %d %s; echo \"(guest ibv_rc_pingpong: exit $? - a retry error is expected, nobody ACKs)\"",
		vm.GID4, port, interop.HostIP), 40*time.Second)
	fmt.Print(g)
	if err := <-done; err != nil {
		return fmt.Errorf("hostsmoke: %v", err)
	}
	return nil
}

// lockedBuf collects a child's output while the harness polls it.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Contains(l.b.Bytes(), []byte(s))
}
