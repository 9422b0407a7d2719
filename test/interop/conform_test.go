//go:build linux

package interop

import (
	"errors"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/conform"
)

// TestConformRunsCoverEveryScenario: between them the CI's conform runs reach every scenario
// at least once, and each selects only scenarios its tool reaches in its role.
func TestConformRunsCoverEveryScenario(t *testing.T) {
	seen := map[string]bool{}
	names := map[string]bool{}
	for _, r := range ConformRuns() {
		require.Falsef(t, names[r.Name], "two runs named %s", r.Name)
		names[r.Name] = true
		sc := r.Scenarios()
		require.NotEmptyf(t, sc, "%s selects no scenario", r.Name)
		for _, s := range sc {
			require.Truef(t, s.Reaches(r.Tool), "%s: %s not reachable", r.Name, s.ID)
			seen[s.ID] = true
		}
		require.Contains(t, r.GuestCmd(1, 20001), "-p 20001")
		require.Contains(t, r.GuestLoop(1, 20001, "/tmp/p"), "echo $$ > /tmp/p;")
	}
	for _, s := range conform.All() {
		require.Truef(t, seen[s.ID], "no conform run reaches %s", s.ID)
	}
	require.Len(t, SelectConform(ConformRuns(), "conform/serve/"), 4)
	require.Len(t, SelectConform(ConformRuns(), "rc_pingpong,ud_pingpong"), 3)
	require.Empty(t, SelectConform(ConformRuns(), "write_bw/RC"))
}

func TestConformRunArgs(t *testing.T) {
	runs := SelectConform(ConformRuns(), "conform/ib_read_bw")
	require.Len(t, runs, 1)
	a := strings.Join(runs[0].RunArgs(20005, "P", "R.html", "10.78.0.11"), " ")
	require.Contains(t, a, "--tool ib_read_bw -p 20005 --timeout 12s -json --pcap-dir P --report R.html -run ^(D-READ-EXTRA|D-READ-PAD|R-BOUNDS-READ|R-DUP-READ|")
	args := runs[0].RunArgs(1, "P", "R", "x")
	i := slices.Index(args, "-run")
	require.Positive(t, i)
	re := regexp.MustCompile(args[i+1])
	for _, s := range conform.All() {
		want := false
		for _, x := range runs[0].Scenarios() {
			want = want || x.ID == s.ID
		}
		require.Equalf(t, want, re.MatchString(s.ID), "-run and %s", s.ID)
	}
	require.True(t, strings.HasSuffix(a, " 10.78.0.11"), a)
	serve := SelectConform(ConformRuns(), "conform/serve/ib_write_bw")[0]
	require.True(t, strings.HasSuffix(strings.Join(serve.RunArgs(1, "P", "R", "x"), " "), "--serve"))
	require.Less(t, serve.Bound+3*time.Second, serve.Timeout, "a client left running must die before the next scenario gives up")
	require.Contains(t, serve.GuestCmd(1, 2), "10.78.0.1")
}

func TestParseConformJSON(t *testing.T) {
	recs, err := ParseConformJSON(`{"id":"R-ACK-WRITE","title":"t","rule":"r","tool":"ib_write_bw","verdict":"PASS","evidence":"ACK","elapsed_ns":1000000,"packets":2}
{"id":"D-ICRC","title":"t","rule":"r","tool":"ib_write_bw","verdict":"FAIL","evidence":"answered","elapsed_ns":5}
`)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	require.Equal(t, conform.Pass, recs[0].Verdict)
	require.Equal(t, time.Millisecond, recs[0].Elapsed)
	require.Equal(t, conform.Fail, recs[1].Verdict)
	_, err = ParseConformJSON("ID VERDICT EVIDENCE\n")
	require.Error(t, err)
	_, err = ParseConformJSON(`{"id":"X","verdict":"MAYBE"}`)
	require.Error(t, err)
}

// exitErr runs a shell that exits with code: a real *exec.ExitError.
func exitErr(t *testing.T, code string) error {
	t.Helper()
	err := exec.Command("sh", "-c", "exit "+code).Run()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee))
	return err
}

// TestJudgeConformRun: rxe's FAILs never break the run; a hang, a panic, a bad exit, a missing
// record or an ERROR verdict does.
func TestJudgeConformRun(t *testing.T) {
	run := ConformRun{Name: "conform/ib_atomic_bw", Tool: conform.IBAtomicBW, Only: "^R-ATOMIC-(FETCHADD|CMPSWAP)$", Timeout: time.Second}
	ids := []string{}
	for _, s := range run.Scenarios() {
		ids = append(ids, s.ID)
	}
	require.Len(t, ids, 2)
	recs := func(v ...conform.Verdict) []conform.Result {
		var out []conform.Result
		for i, x := range v {
			out = append(out, conform.Result{ID: ids[i], Verdict: x, Evidence: "e"})
		}
		return out
	}
	require.Empty(t, JudgeConformRun(run, nil, "", recs(conform.Pass, conform.Pass)))
	require.Empty(t, JudgeConformRun(run, exitErr(t, "1"), "", recs(conform.Pass, conform.Fail)), "a FAIL is a finding")
	require.Empty(t, JudgeConformRun(run, nil, "", recs(conform.Deviation, conform.Skip)))

	require.NotEmpty(t, JudgeConformRun(run, exitErr(t, "1"), "", recs(conform.Pass, conform.Error)), "ERROR breaks")
	require.NotEmpty(t, JudgeConformRun(run, exitErr(t, "124"), "", recs(conform.Pass)), "hang")
	require.NotEmpty(t, JudgeConformRun(run, exitErr(t, "2"), "panic: boom\ngoroutine 1 [running]:", recs(conform.Pass)), "panic")
	require.NotEmpty(t, JudgeConformRun(run, nil, "", recs(conform.Pass)), "a missing record")
	swapped := recs(conform.Pass, conform.Pass)
	swapped[0].ID, swapped[1].ID = swapped[1].ID, swapped[0].ID
	require.NotEmpty(t, JudgeConformRun(run, nil, "", swapped), "records out of order")
	unreach := recs(conform.Pass, conform.Skip)
	unreach[1].Evidence = "ib_atomic_bw cannot reach this case"
	require.NotEmpty(t, JudgeConformRun(run, nil, "", unreach))
}
