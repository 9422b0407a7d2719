//go:build linux

package interop

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rxed/rxed/pkg/conform"
)

// ConformResult is the outcome of one ConformRun.
type ConformResult struct {
	Run     ConformRun
	Records []conform.Result // one per scenario, in order
	// Problems are breakages of the run itself (hang, panic, bad exit, missing or ERROR
	// records): they fail the step. Verdicts, FAILs included, are not problems.
	Problems  []string
	Notes     []string
	Elapsed   time.Duration
	Cmd       string // rxed conform's command line
	GuestCmd  string // the guest's loop
	PeerDelta Counters
	KernelLog string // the guest's RDMA kernel messages during the run
	// Panics are the guest kernel panics the run's scenarios caused (each scenario's record
	// is its FAIL; the guest was rebooted and the run went on).
	Panics  []GuestPanic
	PcapDir string // ID.pcap per scenario
	// Decoded is `rxed decode` of the capture of every FAIL and DEVIATION: the packet
	// evidence CONFORMANCE.md shows with the finding.
	Decoded   map[string]string
	LogPrefix string
	Stderr    string
	// Down are the guests found down after a try that broke (RunConformRecovering).
	Down []GuestDown
}

// OK reports whether the run itself held (verdicts aside).
func (r ConformResult) OK() bool { return len(r.Problems) == 0 }

// Counts tallies the verdicts.
func (r ConformResult) Counts() map[conform.Verdict]int {
	m := map[conform.Verdict]int{}
	for _, x := range r.Records {
		m[x.Verdict]++
	}
	return m
}

// RunConform runs c: the guest's tool in a loop, rxed conform on the host in the namespace,
// then stops the loop and judges the run (not the verdicts). If a scenario panics the guest's
// kernel, the panic becomes that scenario's FAIL, the guest is rebooted and the scenarios
// after it run in a further rxed conform process (guest_crash.go).
func (r *Runner) RunConform(ctx context.Context, c ConformRun) (res ConformResult) {
	t0 := time.Now()
	res.Run = c
	res.LogPrefix = filepath.Join(r.LogDir, slug(c.Name))
	res.PcapDir = res.LogPrefix + ".pcaps"
	_ = os.MkdirAll(res.PcapDir, 0o755)
	res.Decoded = map[string]string{}
	defer func() { res.Elapsed = time.Since(t0) }()
	want := c.Scenarios()
	seg := c
	for part := 0; ; part++ {
		p := r.runConformPart(ctx, seg, part, &res)
		res.Problems = append(res.Problems, p.problems...)
		if p.panic == "" {
			res.Records = append(res.Records, p.recs...)
			res.PeerDelta, res.KernelLog = p.delta, p.kernelLog
			break
		}
		var rest []*conform.Scenario
		var culprit string
		var ok bool
		res.Records, rest, culprit, ok = SplitAtPanic(want, res.Records, p.recs, p.panic)
		if !ok {
			res.Problems = append(res.Problems, "the guest's kernel panicked before rxed conform printed a record:\n"+p.panic)
			break
		}
		res.Panics = append(res.Panics, GuestPanic{Scenario: culprit, Excerpt: p.panic})
		rt := time.Now()
		console := fmt.Sprintf("%s.panic%d.console", res.LogPrefix, len(res.Panics))
		if err := r.Lab.Reboot(ctx, r.peer(), console); err != nil {
			res.Problems = append(res.Problems, fmt.Sprintf("rebooting the guest after its kernel panicked on %s: %v", culprit, err))
			break
		}
		res.Notes = append(res.Notes, fmt.Sprintf("the guest's kernel panicked on %s (its console: %s); "+
			"rebooted in %.0f s, the run went on from the next scenario", culprit, filepath.Base(console), time.Since(rt).Seconds()))
		if len(rest) == 0 {
			break
		}
		var ids []string
		for _, s := range rest {
			ids = append(ids, regexp.QuoteMeta(s.ID))
		}
		seg.Only = "^(" + strings.Join(ids, "|") + ")$"
	}
	res.Problems = append(res.Problems, judgeRecords(want, res.Records)...)
	if len(res.Panics) > 0 {
		res.Notes = append(res.Notes, "hw_counters delta and kernel log: the guest booted last only")
	}
	for _, x := range res.Records {
		if x.Verdict != conform.Fail && x.Verdict != conform.Deviation {
			continue
		}
		d, err := exec.CommandContext(ctx, r.Rxed, "decode", filepath.Join(res.PcapDir, x.ID+".pcap")).CombinedOutput()
		if err != nil {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: rxed decode: %v", x.ID, err))
		}
		res.Decoded[x.ID] = string(d)
	}
	return res
}

// conformPart is what one rxed conform process of a run gave.
type conformPart struct {
	recs      []conform.Result
	problems  []string // of the process itself (exit, panic, output), not of the records
	panic     string   // KernelPanic's excerpt of the guest console, "" if the guest lived
	delta     Counters
	kernelLog string
}

// runConformPart runs one rxed conform process for c's scenarios: the guest tool's loop,
// rxed conform, then (if the guest did not panic) the loop's end and the guest's counters.
// Part 0 writes res.LogPrefix's files; part k after a reboot writes them with ".partK".
func (r *Runner) runConformPart(ctx context.Context, c ConformRun, part int, res *ConformResult) (p conformPart) {
	fail := func(format string, a ...any) { p.problems = append(p.problems, fmt.Sprintf(format, a...)) }
	port := r.nextPort()
	vm := r.peer()
	prefix := res.LogPrefix
	if part > 0 {
		prefix += fmt.Sprintf(".part%d", part)
	}
	consoleFrom := fileSize(vm.Console)

	before, err := r.snapshot(ctx)
	if err != nil {
		fail("counters before: %v", err)
		return p
	}
	const pidfile = "/tmp/rxed-conform.pid"
	stopLoop := func() {
		// the loop shell leads its process group; the running tool is in it (timeout
		// --foreground does not make a group of its own)
		_, _ = r.Lab.Guest(context.Background(), vm, fmt.Sprintf(`p=$(cat %s 2>/dev/null) && [ -n "$p" ] && kill -KILL -- -$p 2>/dev/null; rm -f %s; true`, pidfile, pidfile), 20*time.Second)
	}
	stopLoop() // a loop an interrupted run left
	guestCmd := c.GuestLoop(vm.GID4, port, pidfile)
	bound := c.ProcessBound()
	cctx, cancel := context.WithTimeout(ctx, bound+30*time.Second)
	defer cancel()
	gp, err := startProc(r.Lab.guestCmd(cctx, vm, guestCmd))
	if err != nil {
		fail("guest loop did not start: %v", err)
		return p
	}
	panicked := func() bool {
		p.panic, _ = KernelPanic(readFrom(vm.Console, consoleFrom))
		return p.panic != ""
	}
	defer func() {
		if p.panic == "" {
			stopLoop()
		}
		stopProc(gp)
	}()
	if !c.Serve {
		// the first server instance must listen before the first scenario dials (later ones
		// restart while the previous scenario closes; rxed conform retries a refused dial)
		if err := r.waitListen(cctx, end{vm: vm}, gp, port); err != nil {
			fail("guest %s: %v: %s", c.Tool, err, tail(gp.out.String(), 5))
			return p
		}
	}
	args := c.RunArgs(port, res.PcapDir, prefix+".report.html", vm.IP)
	cmdline := "rxed " + strings.Join(args, " ")
	argv := append([]string{"netns", "exec", Netns, "timeout", "-k", "5", fmt.Sprint(int(bound.Seconds())), r.Rxed}, args...)
	cmd := exec.CommandContext(cctx, "ip", argv...)
	cmd.SysProcAttr = childAttr()
	cmd.WaitDelay = 2 * time.Second
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) } // timeout passes it on to rxed
	var stdout, stderr syncBuf
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		fail("rxed conform did not start: %v", err)
		return p
	}
	waited := stopOnPanic(cmd, vm.Console, consoleFrom, &stdout)
	runErr := cmd.Wait()
	stopped := waited()
	out := stdout.String()
	if part == 0 {
		res.Cmd, res.GuestCmd = cmdline, guestCmd
	}
	res.Stderr += stderr.String()
	_ = os.WriteFile(prefix+".conform.json", []byte("# "+cmdline+"\n"+out), 0o644)
	_ = os.WriteFile(prefix+".conform.stderr.txt", []byte(stderr.String()), 0o644)
	dead := panicked()
	if !dead {
		stopLoop()
	}
	stopProc(gp)
	_ = os.WriteFile(prefix+".guest.txt", []byte("# "+guestCmd+"\n"+gp.out.String()), 0o644)

	p.recs, err = ParseConformJSON(out)
	if err != nil {
		fail("%v", err)
	}
	if !stopped { // the harness's own SIGTERM is no breakage
		p.problems = append(p.problems, judgeExit(c, runErr, stderr.String())...)
	}
	if dead {
		return p
	}
	after, err := r.snapshot(ctx)
	if err != nil {
		if panicked() { // it died after the last record
			return p
		}
		fail("counters after: %v", err)
		return p
	}
	p.delta = Delta(before[0].hw, after[0].hw)
	if after[0].dmesg > before[0].dmesg {
		p.kernelLog = r.kernelLog(ctx, vm, before[0].dmesg)
	}
	return p
}

// stopOnPanic watches the guest's console while conform runs: once the guest's kernel has
// panicked, every scenario after the one in progress would only wait for a dead peer (12 s,
// then 3 s each for a missing route: 100 s for ib_write_bw's run), so when conform has
// printed the record of the scenario in progress (the culprit's: CrashedScenario blames the
// last record when there is no ERROR) it is stopped. Call the returned function once cmd has
// exited; it reports whether the watcher stopped it.
func stopOnPanic(cmd *exec.Cmd, console string, from int64, stdout *syncBuf) (waited func() bool) {
	var stopped atomic.Bool
	exited := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		lines := -1 // conform's records when the panic was seen
		for {
			select {
			case <-exited:
				return
			case <-tick.C:
			}
			n := strings.Count(stdout.String(), "\n")
			if lines < 0 {
				if _, ok := KernelPanic(readFrom(console, from)); ok {
					lines = n
				}
				continue
			}
			if n > lines {
				stopped.Store(true)
				_ = cmd.Process.Signal(syscall.SIGTERM)
				return
			}
		}
	}()
	return func() bool {
		close(exited)
		<-finished
		return stopped.Load()
	}
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// readFrom returns path's bytes from offset on (nil if it cannot be read).
func readFrom(path string, offset int64) []byte {
	b, err := os.ReadFile(path)
	if err != nil || offset > int64(len(b)) {
		return nil
	}
	return b[offset:]
}

// ParseConformJSON reads rxed conform -json's records (one JSON object per line).
func ParseConformJSON(out string) ([]conform.Result, error) {
	var recs []conform.Result
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" {
			continue
		}
		var x conform.Result
		if err := json.Unmarshal([]byte(l), &x); err != nil {
			return recs, fmt.Errorf("rxed conform printed a line that is not a record: %q: %v", tail(l, 1), err)
		}
		recs = append(recs, x)
	}
	return recs, sc.Err()
}

// JudgeConformRun decides whether the conform run itself broke: its exit (0, or 1 for a FAIL
// or ERROR verdict; anything else, a signal or the harness's timeout is a breakage), a panic
// on stderr, a record per selected scenario in order, and no ERROR verdict. FAIL, DEVIATION
// and SKIP are the peer's results, never a breakage.
func JudgeConformRun(c ConformRun, runErr error, stderr string, recs []conform.Result) (problems []string) {
	return append(judgeExit(c, runErr, stderr), judgeRecords(c.Scenarios(), recs)...)
}

// judgeExit judges one rxed conform process by its exit and stderr.
func judgeExit(c ConformRun, runErr error, stderr string) (problems []string) {
	var ee *exec.ExitError
	switch {
	case runErr == nil:
	case errors.As(runErr, &ee) && ee.ExitCode() == 1:
	case errors.As(runErr, &ee) && (ee.ExitCode() == 124 || ee.ExitCode() == 137):
		problems = append(problems, fmt.Sprintf("rxed conform hung: killed after %v (exit %d)", c.ProcessBound(), ee.ExitCode()))
	default:
		problems = append(problems, fmt.Sprintf("rxed conform: %v: %s", runErr, tail(stderr, 3)))
	}
	if strings.Contains(stderr, "panic:") || strings.Contains(stderr, "goroutine ") {
		problems = append(problems, "rxed conform panicked: "+tail(stderr, 3))
	}
	return problems
}

// judgeRecords checks the records against the scenarios wanted: one each, in order, none an
// ERROR or an unreachable SKIP.
func judgeRecords(want []*conform.Scenario, recs []conform.Result) (problems []string) {
	if len(recs) != len(want) {
		problems = append(problems, fmt.Sprintf("%d records for %d scenarios", len(recs), len(want)))
	}
	for i, s := range want {
		if i < len(recs) && recs[i].ID != s.ID {
			problems = append(problems, fmt.Sprintf("record %d is %s, want %s", i+1, recs[i].ID, s.ID))
			break
		}
	}
	for _, x := range recs {
		if x.Verdict == conform.Error {
			problems = append(problems, fmt.Sprintf("%s: ERROR: %s", x.ID, x.Evidence))
		}
		if x.Verdict == conform.Skip && strings.Contains(x.Evidence, "cannot reach") {
			problems = append(problems, fmt.Sprintf("%s: selected but SKIPped as unreachable: %s", x.ID, x.Evidence))
		}
	}
	return problems
}
