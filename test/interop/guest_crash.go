//go:build linux

package interop

import (
	"regexp"
	"strings"

	"github.com/rxed/rxed/pkg/conform"
)

// A conformance scenario can do more than fail against rdma_rxe: it can panic the guest's
// kernel (D-PAD did, on Debian's 6.1.0-48: a NULL dereference in rxe_mr_copy in softirq). The
// guest is then dead (qemu runs -no-reboot, the kernel halts on panic), so every later
// scenario of the run would ERROR on a missing peer and every later run would break. The
// harness instead reads the panic off the guest's serial console, keeps it as the finding of
// the scenario that caused it, reboots the guest and runs the rest (RunConform).

// panicMarker is the line every fatal kernel crash ends with ("Kernel panic - not syncing:
// Fatal exception in interrupt", "... Fatal exception", "... softlockup: hung tasks").
const panicMarker = "Kernel panic - not syncing"

// crashStart matches the first line of a kernel crash report.
var crashStart = regexp.MustCompile(`\] (BUG: |Oops: |general protection fault|kernel BUG at|Unable to handle)`)

// KernelPanic reports whether console (the guest's serial output since some point) holds a
// kernel panic, and returns the lines an engineer reads first: the crash's first line, the
// Oops line, the kernel version line, RIP, the top call-trace frames and the panic line.
func KernelPanic(console []byte) (excerpt string, ok bool) {
	s := string(console)
	end := strings.Index(s, panicMarker)
	if end < 0 {
		return "", false
	}
	lines := strings.Split(s[:end+strings.IndexByte(s[end:]+"\n", '\n')], "\n")
	from := 0
	for i, l := range lines {
		if crashStart.MatchString(l) {
			from = i
			break
		}
	}
	var out []string
	frames, inTrace, rip := 0, false, false
	for _, l := range lines[from:] {
		body := stripStamp(l)
		switch {
		case crashStart.MatchString(l), strings.HasPrefix(body, "CPU: "), strings.HasPrefix(body, panicMarker):
			out = append(out, body)
		case strings.HasPrefix(body, "RIP: ") && !rip:
			rip = true // the second RIP line (after the trace) repeats the first
			out = append(out, body)
		case body == "Call Trace:":
			inTrace = true
			out = append(out, body)
		case inTrace && strings.Contains(body, "+0x") && !strings.HasPrefix(body, "? ") && frames < 6:
			frames++
			out = append(out, "  "+body)
		case inTrace && body == "</IRQ>":
			inTrace = false
		}
	}
	return strings.Join(out, "\n"), true
}

// stripStamp drops the "[  426.015822] " timestamp of a kernel log line and trims it.
func stripStamp(l string) string {
	l = strings.TrimSpace(l)
	if strings.HasPrefix(l, "[") {
		if i := strings.IndexByte(l, ']'); i > 0 {
			l = strings.TrimSpace(l[i+1:])
		}
	}
	return l
}

// CrashedScenario says which record's scenario panicked the guest, given the records of the
// rxed conform run during which the console showed the panic. rxed conform runs scenarios in
// order and the dead peer makes every later one an ERROR at setup (no tool server, no route),
// so the culprit is the last record before the first ERROR: that scenario reached the peer and
// lost it (its verdict is the FAIL "peer stopped serving"). If that record PASSed, the panic
// came too late for it to notice and the first ERROR itself is the culprit (it ran while the
// kernel died). With no ERROR the panic came during the last scenario. -1: no record at all.
func CrashedScenario(recs []conform.Result) int {
	firstErr := len(recs)
	for i, x := range recs {
		if x.Verdict == conform.Error {
			firstErr = i
			break
		}
	}
	i := firstErr - 1
	if firstErr < len(recs) && (i < 0 || recs[i].Verdict == conform.Pass) {
		i = firstErr
	}
	return i
}

// MarkPanicked turns the culprit's record into the finding: a peer whose kernel a packet
// panics fails the scenario whatever rxed conform could still judge (an ERROR because the
// setup of its probe found no peer, or a FAIL for the unanswered probe), and its evidence
// says so, keeping what rxed conform saw.
func MarkPanicked(x conform.Result, kernel string) conform.Result {
	was := x.Verdict.String()
	x.Verdict = conform.Fail
	x.Evidence = "the guest's kernel (" + kernel + ") panicked on this scenario's packets (serial console; " +
		"the harness rebooted the guest); rxed conform's own verdict: " + was + ": " + x.Evidence
	return x
}

// GuestPanic is a guest kernel panic a scenario caused.
type GuestPanic struct {
	Scenario string // the culprit's ID (CrashedScenario)
	Excerpt  string // KernelPanic's excerpt of the console
}

var taintedRe = regexp.MustCompile(`CPU: \d+ PID: \d+ Comm: \S+ (?:Not tainted|Tainted: \S+) (\S+)`)

// PanicKernel is the kernel release a panic excerpt names ("6.1.0-48-amd64"), or "unknown".
func PanicKernel(excerpt string) string {
	if m := taintedRe.FindStringSubmatch(excerpt); m != nil {
		return m[1]
	}
	return "unknown"
}

// SplitAtPanic continues a run after the guest panicked during one of its rxed conform
// processes: done are the records of the earlier processes, part those of the one the guest
// died in. It keeps part's records up to the culprit (CrashedScenario), marked as the
// finding, drops the ones after it (ERRORs of the dead peer) and returns the scenarios of
// want that are still to run. ok is false when part has no record to blame.
func SplitAtPanic(want []*conform.Scenario, done, part []conform.Result, excerpt string) (kept []conform.Result, rest []*conform.Scenario, culprit string, ok bool) {
	i := CrashedScenario(part)
	if i < 0 {
		return done, nil, "", false
	}
	kept = append(append(done[:len(done):len(done)], part[:i]...), MarkPanicked(part[i], PanicKernel(excerpt)))
	if len(kept) < len(want) {
		rest = want[len(kept):]
	}
	return kept, rest, part[i].ID, true
}
