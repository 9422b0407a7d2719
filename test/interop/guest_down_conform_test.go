//go:build linux

package interop

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/conform"
	"github.com/stretchr/testify/require"
)

// TestConformRunRecoversAGuestThatHung: a guest that hangs without a panic (left open by
// session Y: RunConform sees only panics) broke the run and would break every run after it.
// A run that held is never checked; one that broke with the guests up is the result; with the
// guest down and rebooted the whole run goes again and its retry decides, the first try's
// files moved aside and its problems a note; a guest that did not reboot ends the run with
// that problem; a retry that breaks too is checked again.
func TestConformRunRecoversAGuestThatHung(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "conform_ibv_rc_pingpong")
	hung := GuestDown{VM: 1, Reason: "it did not answer a command over ssh (signal: killed); no panic on the console, which ends:\ninterop-init: READY", Console: prefix + ".vm1.console"}
	held := ConformResult{Elapsed: 3 * time.Second, Records: []conform.Result{{ID: "D-ICRC", Verdict: conform.Pass}}}
	broke := ConformResult{Elapsed: 40 * time.Second, Problems: []string{"D-PKEY: ERROR record", "counters after: vm1: signal: killed"}}
	for _, tc := range []struct {
		name       string
		tries      []ConformResult
		down       [][]GuestDown
		wantChecks []string
		wantOK     bool
		wantDown   int
		wantNote   string
		wantProb   string
		wantMoved  bool
	}{
		{name: "held", tries: []ConformResult{held}, wantOK: true},
		{name: "broke, guests up", tries: []ConformResult{broke}, down: [][]GuestDown{nil},
			wantChecks: []string{prefix}, wantProb: "D-PKEY: ERROR record"},
		{name: "hung, retry holds", tries: []ConformResult{broke, held}, down: [][]GuestDown{{hung}},
			wantChecks: []string{prefix}, wantOK: true, wantDown: 1, wantMoved: true,
			wantNote: "ran twice: the first try broke (D-PKEY: ERROR record; counters after: vm1: signal: killed) and left guest 1 down (it did not answer a command over ssh (signal: killed); no panic on the console, which ends: interop-init: READY); rebooted"},
		{name: "hung, no reboot", tries: []ConformResult{broke}, down: [][]GuestDown{{{VM: 1, Reason: "its qemu exited", Reboot: "no READY"}}},
			wantChecks: []string{prefix}, wantDown: 1, wantProb: "guest 1 went down and did not reboot: no READY"},
		{name: "hung twice", tries: []ConformResult{broke, broke}, down: [][]GuestDown{{hung}, {hung}},
			wantChecks: []string{prefix, prefix + ".retry"}, wantDown: 2, wantMoved: true, wantProb: "counters after: vm1: signal: killed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(prefix+".conform.json", []byte("first"), 0o644))
			_ = os.Remove(prefix + ".try1.conform.json")
			n := 0
			var checks []string
			got := runRecovering(context.Background(),
				func() ConformResult {
					r := tc.tries[n]
					r.LogPrefix = prefix
					n++
					return r
				},
				func(p string) []GuestDown {
					checks = append(checks, p)
					return tc.down[len(checks)-1]
				})
			require.Len(t, tc.tries, n, "tries")
			require.Equal(t, tc.wantChecks, checks)
			require.Equal(t, tc.wantOK, got.OK())
			require.Len(t, got.Down, tc.wantDown)
			if tc.wantNote != "" {
				require.Equal(t, tc.wantNote, got.Notes[0])
				require.Equal(t, broke.Elapsed+held.Elapsed, got.Elapsed, "the run's time is both tries'")
			}
			if tc.wantProb != "" {
				require.Contains(t, got.Problems, tc.wantProb)
			}
			_, err := os.Stat(prefix + ".try1.conform.json")
			require.Equal(t, tc.wantMoved, err == nil, "first try's files moved aside")
		})
	}

	// CONFORMANCE.md names the guest, why it was down and where its console is, and a failed
	// reboot; the driver counts the downs.
	res := ConformResult{Run: ConformRun{Name: "conform/ibv_rc_pingpong"}, Records: held.Records,
		Down: []GuestDown{hung, {VM: 1, Reason: "its qemu exited", Reboot: "no READY"}}}
	var b bytes.Buffer
	WriteConformReport(&b, RunInfo{}, []ConformResult{res})
	s := b.String()
	require.Contains(t, s, "- guest 1 went down: it did not answer a command over ssh (signal: killed); no panic on the console, which ends: interop-init: READY (console kept: `"+hung.Console+"`)\n")
	require.Contains(t, s, "- guest 1 went down: its qemu exited; **the reboot failed**: no READY\n")
	require.Equal(t, 2, DownCount([]ConformResult{res, held}))
}
