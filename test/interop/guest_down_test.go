//go:build linux

package interop

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDownReasonSaysWhyAGuestIsGone: the CI run at adaa36c lost guest 1 during the first loss
// cell and failed the 47 runs after it on "counters before: signal: killed" without a word
// on why. A panic on the console names the crash (even while qemu and the ssh master live on),
// an exited qemu and an unanswered probe say so with the console's last lines, and a guest
// that answers is fine whatever its console held before the panic line.
func TestDownReasonSaysWhyAGuestIsGone(t *testing.T) {
	panicked, err := os.ReadFile("testdata/console-rxe-dpad-panic.txt")
	require.NoError(t, err)
	booted := []byte("[    1.0] rxe0: added eth0\ninterop-init: READY\n")
	killed := errors.New(`vm1: "true": signal: killed`)
	for _, tc := range []struct {
		name    string
		exited  bool
		console []byte
		probe   error
		want    []string // substrings; nil: not down
	}{
		{"alive", false, booted, nil, nil},
		{"alive, empty console", false, nil, nil, nil},
		{"panic, probe hangs", false, panicked, killed, []string{"its kernel panicked:\nBUG: kernel NULL pointer dereference", "RIP: 0010:rxe_mr_copy"}},
		{"panic, qemu gone", true, panicked, nil, []string{"its kernel panicked:"}},
		{"panic, probe answered (the ssh master outlived it)", false, panicked, nil, []string{"its kernel panicked:"}},
		{"qemu exited", true, booted, nil, []string{"its qemu exited; the console ends:\n[    1.0] rxe0: added eth0\ninterop-init: READY"}},
		{"hung without a panic", false, booted, killed, []string{"did not answer a command over ssh (vm1: \"true\": signal: killed)", "interop-init: READY"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := DownReason(tc.exited, tc.console, tc.probe)
			if tc.want == nil {
				require.Empty(t, got)
				return
			}
			for _, w := range tc.want {
				require.Contains(t, got, w)
			}
		})
	}
	// the console's tail is bounded: a long boot log does not flood RESULTS.md
	long := bytes.Repeat([]byte("[    2.0] line\n"), 500)
	require.LessOrEqual(t, strings.Count(DownReason(true, long, nil), "\n"), 11)
}

// withFirstTry is the retry of a matrix cell as runRecovering leaves it: carrying first.
func withFirstTry(retry, first Result, down []GuestDown) Result {
	carryFirstTry(retry.record(), first.record(), first.brokeVerb(), down)
	return retry
}

// TestCarryFirstTryKeepsTheFirstTryAsANote: the retry decides the cell (pass or fail), the
// first try's problems and the guest's fate are kept in front of the retry's own notes on one
// line (ssh's stderr ended a problem with a newline, which broke RESULTS.md's table row), the
// time is the two tries', and the caller's slice is not aliased.
func TestCarryFirstTryKeepsTheFirstTryAsANote(t *testing.T) {
	first := Result{Pass: false, Problems: []string{"client: exit 1", "counters after: signal: killed: mux_client_request_session: read from master failed: Broken pipe\n"}, Elapsed: 40 * time.Second}
	down := []GuestDown{{VM: 1, Reason: "its kernel panicked:\nBUG: x\nKernel panic - not syncing: y", Console: "/l/c.vm1.console"}}
	for _, pass := range []bool{true, false} {
		retry := Result{Pass: pass, Notes: []string{"guest rxe0 duplicate_request +3"}, Elapsed: 5 * time.Second}
		if !pass {
			retry.Problems = []string{"server: exit 1"}
		}
		got := withFirstTry(retry, first, down)
		require.Equal(t, pass, got.Pass, "the retry decides")
		require.Equal(t, retry.Problems, got.Problems, "the first try's problems are not the cell's")
		require.Equal(t, []string{
			"ran twice: the first try failed (client: exit 1; counters after: signal: killed: mux_client_request_session: read from master failed: Broken pipe) " +
				"and left guest 1 down (its kernel panicked: BUG: x); rebooted",
			"guest rxe0 duplicate_request +3",
		}, got.Notes)
		require.Equal(t, down, got.Down)
		require.Equal(t, 45*time.Second, got.Elapsed)
	}
	roomy := make([]GuestDown, 1, 2)
	roomy[0] = down[0]
	d := withFirstTry(Result{Down: []GuestDown{{VM: 2}}}, first, roomy)
	require.Equal(t, []int{1, 2}, []int{d.Down[0].VM, d.Down[1].VM})
	require.Zero(t, roomy[:2][1].VM, "carryFirstTry appended into the caller's array")
}

// TestKeepFirstTryRenamesTheRunsFiles: the retry writes the same log names, so the first
// try's outputs, counters and captures move aside; the kept console and older .try1 files
// stay, and another cell's files (a longer name with the same start) are not touched.
func TestKeepFirstTryRenamesTheRunsFiles(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "write_bw_loss1pct_65536B.srv")
	for _, f := range []string{prefix + ".server.txt", prefix + ".client.txt", prefix + ".counters.json",
		prefix + ".vm1.console", prefix + ".try1.server.txt", prefix + "x.server.txt"} {
		require.NoError(t, os.WriteFile(f, []byte(f), 0o644))
	}
	keepFirstTry(prefix)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, strings.TrimPrefix(e.Name(), "write_bw_loss1pct_65536B.srv"))
	}
	sort.Strings(names)
	require.Equal(t, []string{".try1.client.txt", ".try1.counters.json", ".try1.server.txt", ".vm1.console", "x.server.txt"}, names)
	b, err := os.ReadFile(prefix + ".try1.client.txt")
	require.NoError(t, err)
	require.Equal(t, prefix+".client.txt", string(b))
}

// TestReportListsTheGuestsThatWentDown: a cell that passed on its retry still shows, below
// the table, which guest went down, why and where its console is; a failed reboot is said
// loudly; with no guest down the section is absent.
func TestReportListsTheGuestsThatWentDown(t *testing.T) {
	c := Cell{Name: "write_bw/loss1%/65536B"}
	rs := []Result{
		{Cell: c, Dir: SubjectServer, Pass: true, Down: []GuestDown{{VM: 1, Reason: "its kernel panicked:\nBUG: z", Console: "/l/x.vm1.console"}}},
		{Cell: c, Dir: SubjectClient, Pass: false, Problems: []string{"p"}, Down: []GuestDown{{VM: 1, Reason: "its qemu exited", Reboot: "vm1: no READY"}}},
	}
	var buf bytes.Buffer
	WriteReport(&buf, RunInfo{Subject: SubjectRxed}, rs)
	s := buf.String()
	require.Contains(t, s, "## Guests that went down")
	require.Contains(t, s, "### write_bw/loss1%/65536B, rxe→rxed (rxed server): guest 1\n\n- console kept: `/l/x.vm1.console`\n\n```\nits kernel panicked:\nBUG: z\n```")
	require.Contains(t, s, "- **the reboot failed**: vm1: no READY")
	require.Equal(t, 2, DownCount(rs))

	buf.Reset()
	WriteReport(&buf, RunInfo{Subject: SubjectRxed}, []Result{{Cell: c, Pass: true}})
	require.NotContains(t, buf.String(), "went down")
	require.Zero(t, DownCount([]Result(nil)))
}

// TestGuestDownShortIsOneLine: the driver's log line and the retried cell's note name the
// crash, not just "its kernel panicked:".
func TestGuestDownShortIsOneLine(t *testing.T) {
	for _, tc := range []struct{ reason, want string }{
		{"its kernel panicked:\nKernel panic - not syncing: sysrq triggered crash", "its kernel panicked: Kernel panic - not syncing: sysrq triggered crash"},
		{"its kernel panicked:\nBUG: kernel NULL pointer dereference, address: 0000000000000104\nOops: 0000 [#1]", "its kernel panicked: BUG: kernel NULL pointer dereference, address: 0000000000000104"},
		{"its qemu exited; the console ends:\n[ 1.0]  a\n[ 2.0] b", "its qemu exited; the console ends: [ 1.0] a"},
		{"one line", "one line"},
		{"", ""},
	} {
		require.Equal(t, tc.want, GuestDown{Reason: tc.reason}.Short())
	}
}

// TestRunRecoveringRetriesOnlyForAGuestThatWentDown: the policy over a fake cell and a fake
// check. A pass is never checked; a failure with every guest up is the cell's result; a guest
// down and rebooted gets one retry that decides (the first try's files moved aside); a guest
// that did not reboot gets no retry and its files stay where RESULTS.md points; a failed
// retry is checked again under its own prefix; an ended context stops before any check.
func TestRunRecoveringRetriesOnlyForAGuestThatWentDown(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "cell.srv")
	panicked := GuestDown{VM: 1, Reason: "its kernel panicked:\nBUG: y"}
	type step struct {
		runs   []Result      // what each try returns, in order
		down   [][]GuestDown // what each check finds, in order
		cancel bool
	}
	for _, tc := range []struct {
		name       string
		step       step
		wantTries  int
		wantChecks []string // the prefixes checked
		wantPass   bool
		wantDown   int
		wantMoved  bool // prefix.server.txt moved to prefix.try1.server.txt
		wantProb   string
	}{
		{name: "pass", step: step{runs: []Result{{Pass: true}}}, wantTries: 1, wantPass: true},
		{name: "fail, guests up", step: step{runs: []Result{{Problems: []string{"client: exit 1"}}}, down: [][]GuestDown{nil}},
			wantTries: 1, wantChecks: []string{prefix}, wantProb: "client: exit 1"},
		{name: "down, retry passes", step: step{runs: []Result{{Problems: []string{"counters before: killed"}}, {Pass: true}}, down: [][]GuestDown{{panicked}}},
			wantTries: 2, wantChecks: []string{prefix}, wantPass: true, wantDown: 1, wantMoved: true},
		{name: "down, retry fails", step: step{runs: []Result{{Problems: []string{"a"}}, {Problems: []string{"b"}}}, down: [][]GuestDown{{panicked}, {panicked}}},
			wantTries: 2, wantChecks: []string{prefix, prefix + ".retry"}, wantDown: 2, wantMoved: true, wantProb: "b"},
		{name: "down, reboot failed", step: step{runs: []Result{{Problems: []string{"a"}}}, down: [][]GuestDown{{{VM: 1, Reason: "its qemu exited", Reboot: "no READY"}}}},
			wantTries: 1, wantChecks: []string{prefix}, wantDown: 1, wantProb: "guest 1 went down and did not reboot: no READY"},
		{name: "context ended", step: step{runs: []Result{{Problems: []string{"a"}}}, cancel: true}, wantTries: 1, wantProb: "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(prefix+".server.txt", []byte("first"), 0o644))
			_ = os.Remove(prefix + ".try1.server.txt")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.step.cancel {
				cancel()
			}
			tries := 0
			var checks []string
			got := runRecovering(ctx,
				func() Result {
					res := tc.step.runs[tries]
					res.LogPrefix = prefix
					res.Pass = res.Pass && len(res.Problems) == 0
					tries++
					return res
				},
				func(p string) []GuestDown {
					checks = append(checks, p)
					return tc.step.down[len(checks)-1]
				})
			require.Equal(t, tc.wantTries, tries)
			require.Equal(t, tc.wantChecks, checks)
			require.Equal(t, tc.wantPass, got.Pass)
			require.Len(t, got.Down, tc.wantDown)
			_, err := os.Stat(prefix + ".try1.server.txt")
			require.Equal(t, tc.wantMoved, err == nil, "first try's files moved aside")
			if tc.wantProb != "" {
				require.Contains(t, got.Problems, tc.wantProb)
			}
		})
	}
}
