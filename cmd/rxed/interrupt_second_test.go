package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// hangingCloseEnv makes this test binary, re-executed, run
// TestHangingCloseHelperProcess: an interrupt watch whose close never
// returns.
const hangingCloseEnv = "RXED_TEST_HANGING_CLOSE"

// TestHangingCloseHelperProcess watches for SIGINT and SIGTERM as the
// tools do, with a close that hangs as one waiting on a peer that never
// answers does. It says "watching" once the signals are routed to the
// watch, and "closing" once the first signal is taken and the close
// begun; it then blocks until its stdin ends (the test gone).
func TestHangingCloseHelperProcess(t *testing.T) {
	if os.Getenv(hangingCloseEnv) != "1" {
		return // a no-op except as the process started below
	}
	exitFunc = syscall.Exit // not os.Exit: the testing package refuses os.Exit(0) in a test
	stop := watchInterrupt(os.Stderr, "perf", func() error {
		fmt.Fprintln(os.Stderr, "closing")
		select {} // the stdin read below keeps the process from looking deadlocked
	})
	defer stop()
	fmt.Fprintln(os.Stderr, "watching")
	_, _ = io.Copy(io.Discard, os.Stdin)
	exitFunc(0)
}

// TestSecondSignalKillsAHangingClose: a tool whose interrupted close
// hangs (its peer never answers) is killed by a second SIGINT or SIGTERM,
// as Go's default action for the signal does, and the shell sees the
// signal's status. Bug reference: the second Ctrl-C of closeOnInterrupt
// (interrupt.go) landed without a test; without its signal.Stop the
// second signal goes to the watch's channel, which nothing reads any
// more, and the process hangs for good.
func TestSecondSignalKillsAHangingClose(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			stderr := newSyncBuffer()
			cmd := exec.Command(os.Args[0], "-test.run=^TestHangingCloseHelperProcess$")
			cmd.Env = append(os.Environ(), hangingCloseEnv+"=1")
			cmd.Stderr = stderr
			stdin, err := cmd.StdinPipe() // held open: the helper blocks reading it
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			done := make(chan struct{}) // closed once the process has ended
			go func() { _ = cmd.Wait(); close(done) }()
			t.Cleanup(func() {
				_ = stdin.Close()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					_ = cmd.Process.Kill()
					<-done
				}
			})

			stderr.waitFor(t, "watching", 30*time.Second)
			require.NoError(t, cmd.Process.Signal(sig))
			stderr.waitFor(t, "closing", 30*time.Second) // the watch took the first signal: its close hangs
			require.NoError(t, cmd.Process.Signal(sig))
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("a second %v did not end the process whose close hangs (the watch kept the signal: no signal.Stop?)\nstderr:\n%s", sig, stderr)
			}
			ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
			require.True(t, ok)
			require.Truef(t, ws.Signaled(), "the process exited with %d instead of being killed by %v\nstderr:\n%s", ws.ExitStatus(), sig, stderr)
			require.Equal(t, sig, ws.Signal())
			require.NotContains(t, stderr.String(), "interrupted", "the hanging close cannot have finished")
		})
	}
}
