//go:build linux

package interop

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/conform"
)

// TestKernelPanicReadsTheConsole: the serial console of the guest D-PAD panicked in the CI
// run at 63dbe54 (Debian 6.1.0-48: a NULL dereference in rxe_mr_copy in softirq; the guest
// died and the rest of the conformance stage broke on it). The excerpt names the crash, the
// kernel, RIP and the top frames once each, without the "? " guesses of the unwinder.
func TestKernelPanicReadsTheConsole(t *testing.T) {
	console, err := os.ReadFile("testdata/console-rxe-dpad-panic.txt")
	require.NoError(t, err)
	ex, ok := KernelPanic(console)
	require.True(t, ok)
	lines := strings.Split(ex, "\n")
	require.Equal(t, "BUG: kernel NULL pointer dereference, address: 0000000000000104", lines[0])
	require.Contains(t, ex, "Oops: 0000 [#1] PREEMPT SMP NOPTI")
	require.Contains(t, ex, "RIP: 0010:rxe_mr_copy+0x49/0x1a0 [rdma_rxe]")
	require.Equal(t, 1, strings.Count(ex, "RIP: "), "the RIP after the trace repeats the first:\n%s", ex)
	require.Contains(t, ex, "  rxe_responder+0x1692/0x1c50 [rdma_rxe]")
	require.NotContains(t, ex, "? ", "unreliable frames are left out")
	require.NotContains(t, ex, "native_safe_halt", "the interrupted idle task is not the crash")
	require.Equal(t, "Kernel panic - not syncing: Fatal exception in interrupt", lines[len(lines)-1])
	require.Equal(t, "6.1.0-48-amd64", PanicKernel(ex))
	require.LessOrEqual(t, len(lines), 14)

	// the panic line is what decides: an Oops the kernel survived, a console cut before the
	// panic, and an ordinary boot log are not panics
	i := bytes.Index(console, []byte("Kernel panic"))
	for _, c := range [][]byte{console[:i], console[:i/2], []byte("[    1.0] rxe0: added eth0\n"), nil} {
		_, ok := KernelPanic(c)
		require.False(t, ok)
	}
	require.Equal(t, "unknown", PanicKernel("Kernel panic - not syncing: x"))
}

// TestCrashedScenarioPicksTheCulprit: after a panic every later scenario ERRORs at setup, so
// the culprit is the record before the first ERROR, unless that one PASSed (the panic came
// after its verdict), then the first ERROR; with no ERROR the last record.
func TestCrashedScenarioPicksTheCulprit(t *testing.T) {
	P, F, E, D := conform.Pass, conform.Fail, conform.Error, conform.Deviation
	for _, tc := range []struct {
		v    []conform.Verdict
		want int
	}{
		{[]conform.Verdict{P, P, F, E, E}, 2}, // the CI run: D-PAD FAILed, D-PKEY... ERRORed
		{[]conform.Verdict{P, D, E}, 1},
		{[]conform.Verdict{P, P, E, E}, 2}, // the culprit's own setup found the peer dying
		{[]conform.Verdict{E, E}, 0},
		{[]conform.Verdict{P, F}, 1}, // the last scenario's packets
		{[]conform.Verdict{P}, 0},
		{nil, -1},
	} {
		var recs []conform.Result
		for i, v := range tc.v {
			recs = append(recs, conform.Result{ID: string(rune('A' + i)), Verdict: v})
		}
		require.Equal(t, tc.want, CrashedScenario(recs), "%v", tc.v)
	}
}

// TestMarkPanickedKeepsWhatConformSaw: the culprit's record becomes a FAIL that says the
// kernel panicked and keeps rxed conform's own verdict and evidence.
func TestMarkPanickedKeepsWhatConformSaw(t *testing.T) {
	x := MarkPanicked(conform.Result{ID: "D-PAD", Verdict: conform.Error, Evidence: "setup: no tool server"}, "6.1.0-48-amd64")
	require.Equal(t, conform.Fail, x.Verdict)
	require.Equal(t, "D-PAD", x.ID)
	require.Contains(t, x.Evidence, "kernel (6.1.0-48-amd64) panicked")
	require.True(t, strings.HasSuffix(x.Evidence, "own verdict: ERROR: setup: no tool server"), x.Evidence)
}

// TestConformReportShowsAPanic: a run whose scenario panicked the guest holds (its records
// are complete after the reboot) and CONFORMANCE.md says so at the top and shows the console
// with the finding.
func TestConformReportShowsAPanic(t *testing.T) {
	console, err := os.ReadFile("testdata/console-rxe-dpad-panic.txt")
	require.NoError(t, err)
	ex, ok := KernelPanic(console)
	require.True(t, ok)
	run := ConformRun{Name: "conform/ibv_rc_pingpong", Tool: conform.IBVRCPingpong, Only: "^(D-ICRC|D-PAD)$", Timeout: time.Second}
	want := run.Scenarios()
	require.Len(t, want, 2)
	recs := []conform.Result{
		{ID: want[0].ID, Verdict: conform.Pass, Evidence: "dropped"},
		MarkPanicked(conform.Result{ID: want[1].ID, Verdict: conform.Fail, Evidence: "peer stopped serving"}, PanicKernel(ex)),
	}
	require.Empty(t, judgeRecords(want, recs))
	require.NotEmpty(t, judgeRecords(want, recs[:1]), "a run cut by the panic with nothing after the reboot is short")
	res := ConformResult{Run: run, Records: recs, Panics: []GuestPanic{{Scenario: "D-PAD", Excerpt: ex}}}
	var b bytes.Buffer
	WriteConformReport(&b, RunInfo{Kernel: "6.1.0-48-amd64"}, []ConformResult{res})
	s := b.String()
	require.Contains(t, s, "1 held, 0 broke")
	require.Contains(t, s, "**the guest's kernel panicked 1 times** (D-PAD in conform/ibv_rc_pingpong)")
	require.Contains(t, s, "### D-PAD: ")
	require.Contains(t, s, "# the guest's serial console: its kernel panicked\nBUG: kernel NULL pointer dereference")
	require.Contains(t, s, ConformFindings["D-PAD"][:40])
}

// TestSplitAtPanicResumesAfterTheCulprit: the records before the culprit are kept (the first
// version kept only the culprit, so the part after the reboot started at the second scenario
// again and panicked on D-PAD anew, run after run), the culprit is the FAIL, the ERRORs after
// it are dropped and exactly the scenarios after it run next; a second panic in that part
// continues from the records of both.
func TestSplitAtPanicResumesAfterTheCulprit(t *testing.T) {
	run := ConformRun{Name: "conform/ib_write_bw", Tool: conform.IBWriteBW, Only: "^D-(DESTQP|ICRC|PAD|PKEY|TVER)$", Timeout: time.Second}
	want := run.Scenarios()
	require.Len(t, want, 5)
	rec := func(i int, v conform.Verdict) conform.Result {
		return conform.Result{ID: want[i].ID, Verdict: v, Evidence: "e"}
	}
	ex := "CPU: 0 PID: 0 Comm: swapper/0 Not tainted 6.1.0-48-amd64 #1\nKernel panic - not syncing: x"
	part := []conform.Result{rec(0, conform.Pass), rec(1, conform.Pass), rec(2, conform.Fail), rec(3, conform.Error), rec(4, conform.Error)}
	kept, rest, culprit, ok := SplitAtPanic(want, nil, part, ex)
	require.True(t, ok)
	require.Equal(t, want[2].ID, culprit)
	require.Len(t, kept, 3)
	require.Equal(t, []conform.Verdict{conform.Pass, conform.Pass, conform.Fail}, []conform.Verdict{kept[0].Verdict, kept[1].Verdict, kept[2].Verdict})
	require.Contains(t, kept[2].Evidence, "6.1.0-48-amd64")
	require.Equal(t, want[3:], rest)

	// the part after the reboot panics on its first scenario's packets, after its verdict
	kept2, rest2, culprit2, ok := SplitAtPanic(want, kept, []conform.Result{rec(3, conform.Pass), rec(4, conform.Error)}, ex)
	require.True(t, ok)
	require.Equal(t, want[4].ID, culprit2)
	require.Len(t, kept2, 5)
	require.Empty(t, rest2)
	require.Empty(t, judgeRecords(want, kept2))
	require.Len(t, kept, 3, "the earlier records are not written over")

	_, _, _, ok = SplitAtPanic(want, kept, nil, ex)
	require.False(t, ok)
}
