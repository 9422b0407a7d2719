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
	"strings"
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
	PcapDir   string // ID.pcap per scenario
	// Decoded is `rxed decode` of the capture of every FAIL and DEVIATION: the packet
	// evidence CONFORMANCE.md shows with the finding.
	Decoded   map[string]string
	LogPrefix string
	Stderr    string
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
// then stops the loop and judges the run (not the verdicts).
func (r *Runner) RunConform(ctx context.Context, c ConformRun) (res ConformResult) {
	t0 := time.Now()
	res.Run = c
	port := r.nextPort()
	vm := r.peer()
	res.LogPrefix = filepath.Join(r.LogDir, slug(c.Name))
	res.PcapDir = res.LogPrefix + ".pcaps"
	_ = os.MkdirAll(res.PcapDir, 0o755)
	fail := func(format string, a ...any) { res.Problems = append(res.Problems, fmt.Sprintf(format, a...)) }
	defer func() { res.Elapsed = time.Since(t0) }()

	before, err := r.snapshot(ctx)
	if err != nil {
		fail("counters before: %v", err)
		return res
	}
	const pidfile = "/tmp/rxed-conform.pid"
	stopLoop := func() {
		// the loop shell leads its process group; the running tool is in it (timeout
		// --foreground does not make a group of its own)
		_, _ = r.Lab.Guest(context.Background(), vm, fmt.Sprintf(`p=$(cat %s 2>/dev/null) && [ -n "$p" ] && kill -KILL -- -$p 2>/dev/null; rm -f %s; true`, pidfile, pidfile), 20*time.Second)
	}
	stopLoop() // a loop an interrupted run left
	res.GuestCmd = c.GuestLoop(vm.GID4, port, pidfile)
	bound := c.ProcessBound()
	cctx, cancel := context.WithTimeout(ctx, bound+30*time.Second)
	defer cancel()
	gp, err := startProc(r.Lab.guestCmd(cctx, vm, res.GuestCmd))
	if err != nil {
		fail("guest loop did not start: %v", err)
		return res
	}
	defer func() { stopLoop(); stopProc(gp) }()
	if !c.Serve {
		// the first server instance must listen before the first scenario dials (later ones
		// restart while the previous scenario closes; rxed conform retries a refused dial)
		if err := r.waitListen(cctx, end{vm: vm}, gp, port); err != nil {
			fail("guest %s: %v: %s", c.Tool, err, tail(gp.out.String(), 5))
			return res
		}
	}
	args := c.RunArgs(port, res.PcapDir, res.LogPrefix+".report.html", vm.IP)
	res.Cmd = "rxed " + strings.Join(args, " ")
	argv := append([]string{"netns", "exec", Netns, "timeout", "-k", "5", fmt.Sprint(int(bound.Seconds())), r.Rxed}, args...)
	cmd := exec.CommandContext(cctx, "ip", argv...)
	cmd.SysProcAttr = childAttr()
	cmd.WaitDelay = 2 * time.Second
	var stdout, stderr syncBuf
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	res.Stderr = stderr.String()
	out := stdout.String()
	_ = os.WriteFile(res.LogPrefix+".conform.json", []byte("# "+res.Cmd+"\n"+out), 0o644)
	_ = os.WriteFile(res.LogPrefix+".conform.stderr.txt", []byte(res.Stderr), 0o644)
	stopLoop()
	stopProc(gp)
	_ = os.WriteFile(res.LogPrefix+".guest.txt", []byte("# "+res.GuestCmd+"\n"+gp.out.String()), 0o644)

	res.Records, err = ParseConformJSON(out)
	if err != nil {
		fail("%v", err)
	}
	res.Problems = append(res.Problems, JudgeConformRun(c, runErr, res.Stderr, res.Records)...)

	res.Decoded = map[string]string{}
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

	after, err := r.snapshot(ctx)
	if err != nil {
		fail("counters after: %v", err)
		return res
	}
	res.PeerDelta = Delta(before[0].hw, after[0].hw)
	if after[0].dmesg > before[0].dmesg {
		res.KernelLog = r.kernelLog(ctx, vm, before[0].dmesg)
	}
	return res
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
	want := c.Scenarios()
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
