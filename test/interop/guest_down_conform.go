//go:build linux

package interop

import (
	"context"
	"strings"
	"syscall"
	"time"
)

// A guest can also go down under the conformance suite without a panic on its console (hung,
// or its qemu gone), which RunConform's own check (guest_crash.go) does not see: the run then
// breaks, and so would every run after it against the dead guest. RunConformRecovering applies
// the matrix's policy (runRecovering): after a run that broke the harness checks the guests,
// reboots one that is down, and runs the whole conform run once more; the retry decides.

// RunConformRecovering runs c (RunConform) with the recovery above.
func (r *Runner) RunConformRecovering(ctx context.Context, c ConformRun) ConformResult {
	if r.FreezeGuest != "" && !r.froze && strings.Contains(c.Name, r.FreezeGuest) {
		r.froze = true
		stop := r.freezePeerAfter(ctx, freezeAfter)
		defer stop()
	}
	return runRecovering(ctx,
		func() ConformResult { return r.RunConform(ctx, c) },
		func(prefix string) []GuestDown { return r.RecoverGuests(ctx, prefix) })
}

// freezeAfter is how far into a conform run FreezeGuest stops the guest: its first scenarios
// have run, later ones meet a peer that no longer answers.
const freezeAfter = 5 * time.Second

// freezePeerAfter stops the peer guest's qemu (SIGSTOP: the guest hangs, no panic, no exit)
// after d, unless the returned stop comes first. The qemu is the one running then (a panic's
// reboot may have replaced the one that ran at the start).
func (r *Runner) freezePeerAfter(ctx context.Context, d time.Duration) (stop func()) {
	vm := r.peer()
	t := time.AfterFunc(d, func() {
		r.Lab.mu.Lock()
		defer r.Lab.mu.Unlock()
		if ctx.Err() == nil && vm.qemu != nil && vm.qemu.Process != nil {
			r.Lab.logf("vm%d: freezing its qemu (SIGSTOP), as -freeze-guest asked", vm.Index)
			_ = vm.qemu.Process.Signal(syscall.SIGSTOP)
		}
	})
	return func() { t.Stop() }
}

func (r ConformResult) broke() bool       { return !r.OK() }
func (r ConformResult) logPrefix() string { return r.LogPrefix }
func (r ConformResult) brokeVerb() string { return "broke" }
func (r *ConformResult) record() tryRecord {
	return tryRecord{&r.Problems, &r.Notes, &r.Down, &r.Elapsed}
}
