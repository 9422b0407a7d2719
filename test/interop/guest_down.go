//go:build linux

package interop

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// A guest can die in the middle of the matrix, not only under the conformance suite's crafted
// packets (guest_crash.go): a CI run lost guest 1 during the first loss cell (write_bw at 1%,
// rdma_rxe the requester) and every one of the 47 runs after it failed on "counters before:
// signal: killed", twenty seconds each, with nothing left to say what had happened. So when a
// run fails the harness asks whether the guest is still there; if it is not, it keeps the
// console, reboots the guest, and runs the cell once more. The retry decides the cell: a peer
// that rdma_rxe's own bugs take down now and then does not fail rxed's interop, one that dies
// again on the same cell does. Either way RESULTS.md names the run that lost the guest and
// shows why (the panic off the console, or that the guest stopped answering).

// probeTimeout bounds the liveness probe (one `true` over the guest's multiplexed ssh
// connection, about 50 ms under TCG when the guest is alive).
const probeTimeout = 20 * time.Second

// GuestDown is a guest found unusable after a run, and what became of it.
type GuestDown struct {
	VM      int    // the guest's index (1 is the peer under test)
	Reason  string // DownReason's text
	Console string // where its console was kept ("" if nowhere)
	Reboot  string // "" after a good reboot, else why the reboot failed
}

// Short is the reason on one line: its first two lines (for a panic, the crash's first line).
func (g GuestDown) Short() string {
	l := strings.SplitN(g.Reason, "\n", 3)
	return oneLine(strings.Join(l[:min(2, len(l))], " "))
}

// oneLine folds s's lines and runs of blanks into single spaces (a note is one table cell).
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// DownReason says why a guest is no longer a usable peer, given whether its qemu has exited,
// its serial console since it booted, and the error of the liveness probe (nil: it answered;
// not consulted when qemu exited). "" means it is fine. A panic on the console decides first,
// since a guest whose kernel died may still have a qemu and even an ssh master that lingers.
func DownReason(exited bool, console []byte, probe error) string {
	if ex, ok := KernelPanic(console); ok {
		return "its kernel panicked:\n" + ex
	}
	if exited {
		return "its qemu exited; the console ends:\n" + tail(string(console), 10)
	}
	if probe != nil {
		return fmt.Sprintf("it did not answer a command over ssh (%v); no panic on the console, which ends:\n%s",
			probe, tail(string(console), 10))
	}
	return ""
}

// GuestDown checks one guest (DownReason). ctx ending is not the guest's fault: it reports
// "" then.
func (l *Lab) GuestDown(ctx context.Context, vm *VM) string {
	console, _ := os.ReadFile(vm.Console)
	exited := vm.qemu == nil || !alive(vm.qemu)
	var probe error
	if !exited {
		_, probe = l.Guest(ctx, vm, "true", probeTimeout)
	}
	if ctx.Err() != nil {
		return ""
	}
	return DownReason(exited, console, probe)
}

// CrashGuest crashes vm's kernel on purpose (sysrq c: "Kernel panic - not syncing: sysrq
// triggered crash") and waits until the console shows the panic.
func (l *Lab) CrashGuest(ctx context.Context, vm *VM) error {
	// the command never returns (the kernel dies under it): its error is expected
	_, _ = l.Guest(ctx, vm, "echo 1 > /proc/sys/kernel/sysrq; sync; echo c > /proc/sysrq-trigger", 5*time.Second)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return awaitConsole(ctx, vm, panicMarker)
}

// RecoverGuests checks every guest and reboots each one that is down, keeping its console as
// prefix.vmN.console. It returns what it found (nil: all were fine).
func (r *Runner) RecoverGuests(ctx context.Context, prefix string) []GuestDown {
	var found []GuestDown
	for _, vm := range r.Lab.VMs {
		why := r.Lab.GuestDown(ctx, vm)
		if why == "" {
			continue
		}
		d := GuestDown{VM: vm.Index, Reason: why, Console: fmt.Sprintf("%s.vm%d.console", prefix, vm.Index)}
		r.Lab.logf("vm%d is down after %s: %s", vm.Index, filepath.Base(prefix), d.Short())
		if err := r.Lab.Reboot(ctx, vm, d.Console); err != nil {
			d.Reboot = err.Error()
		}
		found = append(found, d)
	}
	return found
}

// RunRecovering runs c in direction d (Run). If the run failed and a guest is down after it,
// the guest is rebooted and the cell runs once more; the retry's result is the cell's, with
// the first try and the guest's fate attached (carryFirstTry). A retry that fails too is
// followed by another check, so the next cell finds a live guest.
func (r *Runner) RunRecovering(ctx context.Context, c Cell, d Direction) Result {
	if r.CrashGuest != "" && !r.crashed && strings.Contains(c.Name, r.CrashGuest) {
		r.crashed = true
		if err := r.Lab.CrashGuest(ctx, r.peer()); err != nil {
			r.Lab.logf("crashing vm%d: %v", r.peer().Index, err)
		}
	}
	return runRecovering(ctx,
		func() Result { return r.Run(ctx, c, d) },
		func(prefix string) []GuestDown { return r.RecoverGuests(ctx, prefix) })
}

// recoverable is what runRecovering needs of a try's result: a pointer to a matrix cell's
// Result or a conform run's ConformResult.
type recoverable[R any] interface {
	*R
	broke() bool       // the try failed (a cell that did not pass, a conform run that broke)
	logPrefix() string // where the try's files are
	record() tryRecord // the fields the policy writes
	brokeVerb() string // how the first-try note says the try ended ("failed", "broke")
}

// tryRecord points at the fields of a try's result that the recovery policy writes, which
// Result and ConformResult both have.
type tryRecord struct {
	problems, notes *[]string
	down            *[]GuestDown
	elapsed         *time.Duration
}

// runRecovering is the recovery policy (RunRecovering, RunConformRecovering) over its two
// steps: run (one try) and recoverDown (RecoverGuests with the given prefix).
func runRecovering[R any, P recoverable[R]](ctx context.Context, run func() R, recoverDown func(prefix string) []GuestDown) R {
	res := run()
	first := P(&res)
	if !first.broke() || ctx.Err() != nil {
		return res
	}
	down := recoverDown(first.logPrefix())
	if len(down) == 0 {
		return res
	}
	for _, g := range down {
		if g.Reboot != "" {
			rec := first.record()
			*rec.down = down
			*rec.problems = append(*rec.problems, fmt.Sprintf("guest %d went down and did not reboot: %s", g.VM, g.Reboot))
			return res
		}
	}
	keepFirstTry(first.logPrefix()) // only when there is a retry to write the same names
	retry := run()
	again := P(&retry)
	carryFirstTry(again.record(), first.record(), first.brokeVerb(), down)
	if again.broke() && ctx.Err() == nil {
		rec := again.record()
		*rec.down = append(*rec.down, recoverDown(again.logPrefix()+".retry")...)
	}
	return retry
}

func (r Result) broke() bool        { return !r.Pass }
func (r Result) logPrefix() string  { return r.LogPrefix }
func (r Result) brokeVerb() string  { return "failed" }
func (r *Result) record() tryRecord { return tryRecord{&r.Problems, &r.Notes, &r.Down, &r.Elapsed} }

// keepFirstTry renames the first try's output files (prefix.server.txt, ...) to
// prefix.try1.server.txt, ... so the retry does not overwrite them.
func keepFirstTry(prefix string) {
	files, _ := filepath.Glob(prefix + ".*")
	for _, f := range files {
		rest := strings.TrimPrefix(f, prefix)
		if strings.HasPrefix(rest, ".vm") || strings.HasPrefix(rest, ".try1") {
			continue // a console kept by RecoverGuests, or already kept
		}
		_ = os.Rename(f, prefix+".try1"+rest)
	}
}

// carryFirstTry writes the first try into the retry's record: a note of how it ended (verb)
// and its problems, which did not decide the cell or run, the guests found down after it
// ahead of the retry's, and its time.
func carryFirstTry(retry, first tryRecord, verb string, down []GuestDown) {
	*retry.notes = append([]string{firstTryNote(verb, *first.problems, down)}, *retry.notes...)
	*retry.down = append(down[:len(down):len(down)], *retry.down...)
	*retry.elapsed += *first.elapsed
}

// firstTryNote says that a try ran twice: how the first ended (verb), its problems, and the
// guests found down after it.
func firstTryNote(verb string, problems []string, down []GuestDown) string {
	var who []string
	for _, g := range down {
		who = append(who, fmt.Sprintf("guest %d down (%s)", g.VM, g.Short()))
	}
	return fmt.Sprintf("ran twice: the first try %s (%s) and left %s; rebooted",
		verb, oneLine(strings.Join(problems, "; ")), strings.Join(who, ", "))
}
