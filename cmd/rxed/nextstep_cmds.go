package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"syscall"
)

// The next steps of allreduce, demo and serve, whose failures said what
// broke and not what to do about it, as the other tools' do (nextstep.go).
// allreduce's ring errors come from examples/allreduce as text (its
// causes formatted, not wrapped), so they are told apart by their words:
// nextstep_cmds_test.go runs each on loopback, so a change of wording
// there shows.

// failHint is fail with a command's own hint: hint "" falls back on the
// common socket hints (nextStep).
func failHint(stderr io.Writer, name string, err error, hint string) int {
	if hint == "" {
		hint = nextStep(err)
	}
	fmt.Fprintf(stderr, "rxed %s: %s%s\n", name, strings.ReplaceAll(err.Error(), "\n", "; "), hint)
	return 1
}

// allreduceNextStep is the hint of a failed ring. rankProcess: one rank
// per process (--rank), whose neighbours are other processes.
func allreduceNextStep(err error, rankProcess bool) string {
	msg := err.Error()
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return " (another process has that port there, an earlier allreduce perhaps: stop it, or give every rank another --tcp-port and --cm-port)"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		if rankProcess {
			return " (not an address of this host: --peers must name this host's address at position --rank; ip addr lists them)"
		}
		return " (not an address of this host: --addr and the next ones, one per rank, must be; use 127.0.1.x, or add them: ip addr add 10.0.0.2/32 dev lo)"
	case strings.Contains(msg, "refused rank"), strings.Contains(msg, " mismatch: "), strings.Contains(msg, "as its neighbour"):
		// examples/allreduce's mismatch (the refusing rank's own error has
		// no "refused"): ranks, sizes or positions differ.
		return " (the ranks disagree about the ring: start every rank with the same --peers, -b and -e)"
	case strings.Contains(msg, "did it die?"), strings.Contains(msg, "left the ring"), strings.Contains(msg, "on the connection to rank"),
		strings.Contains(msg, "said it finished"):
		return " (a neighbour rank stopped or failed: its own error says why; start every rank again)"
	case !rankProcess:
		return ""
	case strings.Contains(msg, "could not connect to rank"), strings.Contains(msg, "no connection from rank"),
		strings.Contains(msg, "no answer from rank"), strings.Contains(msg, "hello to rank"):
		return " (start every rank within --timeout of the first, each with the same --peers, --cm-port and --tcp-port: is that rank running on its --peers address?)"
	}
	return ""
}

// demoStepError is a demo step whose work request failed or never
// completed: the engines' packets did not get through.
type demoStepError struct{ err error }

func (e *demoStepError) Error() string { return e.err.Error() }
func (e *demoStepError) Unwrap() error { return e.err }

// demoCheckError is a step that completed with the wrong data.
type demoCheckError struct{ msg string }

func (e *demoCheckError) Error() string { return e.msg }

// demoNextStep is the hint of a failed demo.
func demoNextStep(err error, faults bool) string {
	var step *demoStepError
	var check *demoCheckError
	switch {
	case errors.As(err, &step) && faults:
		return " (the injected faults kept the packets from getting through (the QP retries 7 times): ask --fault for less loss)"
	case errors.As(err, &step):
		return " (the two engines' packets did not get through: does a firewall filter UDP between the two --addr on this host?)"
	case errors.As(err, &check):
		return " (the data came back wrong: that is a bug, please report it with the output and a --pcap of the run)"
	}
	return ""
}

// pathHint is the hint of a file flag that could not be opened: one the
// tool creates (--pcap: its directory must exist) or reads (--config,
// --token-file).
func pathHint(err error, creates bool) string {
	switch {
	case errors.Is(err, fs.ErrNotExist) && creates:
		return " (its directory must exist: create that, or give another path)"
	case errors.Is(err, fs.ErrNotExist):
		return " (give the path of an existing file)"
	case errors.Is(err, fs.ErrPermission):
		return " (this user may not open it there: give another path)"
	}
	return ""
}

// serveNextStep is the hint of a daemon that could not start.
func serveNextStep(err error) string {
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "export ") && strings.Contains(msg, syscall.ENOMEM.Error()):
		// internal/daemon formats the cause: no errors.Is.
		return " (not enough memory for that export: give it a smaller size=, or back it by a file: export)"
	case strings.HasPrefix(msg, "--pcap: "):
		return pathHint(err, true)
	}
	return nextStep(err)
}
