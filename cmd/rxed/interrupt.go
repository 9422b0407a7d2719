package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// A tool interrupted (Ctrl-C, SIGTERM) ends as the kernel ends a killed
// librdmacm or libibverbs process: its device closes, so every rdma_cm
// connection still up gets its DREQ (rdmacm's close of the device) and
// the peer learns at once that it is gone. Go's default for SIGINT only
// killed the process: the kernel's CM outlives a process, rxed's does
// not, so a peer waiting on its connection waited until its own timers
// gave up (an rping server a minute, RETRY_EXC_ERR) or for ever (a perf -R
// server idling through the client's run waits for the control
// connection alone). The capture and --counters-out are written too.
// The commands with a shutdown of their own (serve, kv serve, kv bench,
// allreduce) take the signals themselves instead.

// exitMu orders the two ways out of the process: an interrupt's handler
// takes it for good before it closes the engine, and exit takes it
// before the command's status, so the status of a command that failed
// because its device was closed under it does not win over 128+signal.
var exitMu sync.Mutex

// exitFunc ends the process (the tests' helper processes use
// syscall.Exit: the testing package refuses os.Exit(0)).
var exitFunc = os.Exit

// exit ends the process with code, unless an interrupt is ending it.
func exit(code int) {
	exitMu.Lock()
	exitFunc(code)
}

// closeOnInterrupt closes en and exits 128+signal on the first SIGINT or
// SIGTERM, saying so on stderr. stop (deferred by the caller, before the
// engine's own close) ends the watch.
func (en *engine) closeOnInterrupt(stderr io.Writer, name string) (stop func()) {
	return watchInterrupt(stderr, name, en.close)
}

// watchInterrupt is closeOnInterrupt with the close it runs given: the
// tests hand it one that hangs, as a close waiting on a peer that never
// answers does, to see a second signal end the process.
func watchInterrupt(stderr io.Writer, name string, closeFn func() error) (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	quit := make(chan struct{})
	var once sync.Once
	go func() {
		select {
		case sig := <-sigs:
			// A second signal kills the process as Go's default does,
			// should the close itself hang (a peer that never answers).
			signal.Stop(sigs)
			exitMu.Lock()
			_ = closeFn()
			fmt.Fprintf(stderr, "rxed %s: interrupted (%v): closed the device and its connections\n", name, sig)
			exitFunc(128 + int(sig.(syscall.Signal)))
		case <-quit:
		}
	}()
	return func() {
		once.Do(func() {
			signal.Stop(sigs)
			close(quit)
		})
	}
}
