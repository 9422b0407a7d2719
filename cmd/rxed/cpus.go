package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
)

// How many CPUs a tool's Go runtime uses (--cpus).
//
// A tool whose peer runs on the same host shares the host's CPUs with
// it: two Go runtimes with GOMAXPROCS = NumCPU each run twice as many
// threads as there are CPUs, and every completion then waits for the
// kernel to give the thread that handles it a CPU the other process
// holds. Measured on the 2-core VM, `rxed perf write -s 65536 -t 16
// -Q 1` (server and client on 127.0.9.x), default GOMAXPROCS against 1
// in both processes, MB/s in alternating runs: events 1161-1398 against
// 1479-1968, hybrid 1403-1626 against 2003-2458, busy poll 722-970
// against 1679-2310; write_lat's busy-poll p99 89-191 us against
// 29-45 us. A single process holding both ends (the library benchmarks)
// does not pay this, which is most of why the tools got 0.5-0.7x of the
// library (issue 14, goal 3).
//
// So when the peer is certainly on this host, each tool takes half the
// CPUs, as one would pin two perftest processes with taskset. Loopback
// traffic never leaves the host, so a tool whose every --addr is a
// loopback address has its peer here; with any other address the peer
// may be remote and the tool keeps every CPU (its engine workers and the
// application run in parallel). GOMAXPROCS in the environment and
// --cpus win over this default.
//
// A ring of `rxed allreduce --rank` processes on loopback is the same
// with more sharers: each rank process takes its share of the CPUs (one
// of 2 with 4 ranks). Measured on the 2-core VM (docs/performance.md,
// session AA), 4 rank processes at GOMAXPROCS 1 against 2, alternating:
// a 4 KiB allreduce over RDMA 600-1090 us against 900-1270, 64 KiB
// 1010-1270 against 1530-2020, TCP's ring 320-490 against 510-570 at 4
// KiB; from 1 MiB on within the spread. With two Ps each of the four
// runtimes woke its second thread for its wake-ups too: 28 context
// switches per 4 KiB allreduce, 12 at GOMAXPROCS 1, TCP's ring 4.

// chooseProcs returns the GOMAXPROCS a tool should run with and why, or
// 0 to leave the runtime's choice alone. cpusFlag is --cpus (0: not
// given), env the GOMAXPROCS environment variable, sharers how many
// processes (this one included) share the host's CPUs when every address
// is a loopback address: 2 for a tool and its peer, the rank count for a
// ring of rank processes, 1 for a command that holds its peers itself
// (kv bench --inproc).
func chooseProcs(numCPU, cpusFlag int, env string, addrs []netip.Addr, sharers int) (int, string) {
	switch {
	case cpusFlag > 0:
		return cpusFlag, "--cpus"
	case env != "":
		return 0, "" // the runtime already applied it
	case sharers < 2 || numCPU < 2 || len(addrs) == 0:
		return 0, ""
	}
	for _, a := range addrs {
		if !a.Unmap().IsLoopback() {
			return 0, ""
		}
	}
	return max(numCPU/sharers, 1), fmt.Sprintf("every address is a loopback address: %d processes share this host's %d CPUs", sharers, numCPU)
}

// setMaxProcs applies chooseProcs' answer. main sets it to
// runtime.GOMAXPROCS; it stays nil in tests that run commands inside
// the test binary, whose scheduler is not the command's to change.
var setMaxProcs func(int) int

// cpuChoice is what applyCPUs changed, for the command's debug log.
type cpuChoice struct {
	procs, was int
	why        string
}

// applyCPUs sets the process's GOMAXPROCS as --cpus and the addresses
// say (check calls it, so every engine-running command does), and keeps
// the change for logCPUs.
func (e *engineFlags) applyCPUs(env string) {
	sharers := 2
	if e.peerInProcess {
		sharers = 1
	}
	n, why := chooseProcs(runtime.NumCPU(), e.cpus, env, e.addrs, sharers)
	if n == 0 || setMaxProcs == nil {
		return
	}
	if prev := setMaxProcs(n); prev != n {
		e.cpuChoice = cpuChoice{procs: n, was: prev, why: why}
	}
}

// logCPUs logs applyCPUs' change at debug level, if it made one.
func (e *engineFlags) logCPUs(log *slog.Logger) {
	if c := e.cpuChoice; c.procs != 0 {
		log.Debug("GOMAXPROCS", "procs", c.procs, "was", c.was, "cpus", runtime.NumCPU(), "why", c.why)
	}
}

// checkCPUs validates --cpus.
func (e *engineFlags) checkCPUs() error {
	if e.cpus < 0 {
		return fmt.Errorf("--cpus %d: want a positive count (0 or absent: automatic)", e.cpus)
	}
	return nil
}
