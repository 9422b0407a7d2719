//go:build unix

package e2e

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user + system) the process has used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// contextSwitches is how many times the process's threads have given up
// a CPU so far, voluntarily (to sleep: a thread that found no goroutine
// to run, or waits in the kernel) or not. On the 2-vCPU VM waking a
// sleeping thread costs 18-25 us (BenchmarkThreadWake), so a latency
// benchmark's switches per round trip say how much of it was wake-ups.
func contextSwitches() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return ru.Nvcsw + ru.Nivcsw
}
