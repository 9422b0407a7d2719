package kv

import "golang.org/x/sys/unix"

// threadCPU is the calling thread's CPU time in nanoseconds; meaningful
// as a difference on a goroutine locked to its thread.
func threadCPU() uint64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return uint64(ts.Nano())
}
