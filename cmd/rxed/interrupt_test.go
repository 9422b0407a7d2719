package main

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestInterruptedRdmaCMClientDisconnects: a perf -R client interrupted
// (Ctrl-C) in the middle of its run disconnects its rdma_cm connections
// on the way out, as the kernel does for a killed librdmacm process, and
// exits 130 saying so; its server, which idles through a write test
// waiting for the control connection alone, ends at once. Bug (found by
// the newcomer audit, session AG): SIGINT killed the client with Go's
// default action, no DREQ left, and the server waited for ever (--timeout
// does not bound an idle server's wait for the client's run); an rping
// server waited a minute for RETRY_EXC_ERR.
func TestInterruptedRdmaCMClientDisconnects(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	sout, _, sdone := startCmd("perf", "write", "-R", "--addr", a, "-p", "18601", "-D", "120", "--timeout", "5s", "--progress", "0")
	sout.waitFor(t, "Waiting for client to connect", 20*time.Second)
	cli := startProcess(t, "perf", "write", "-R", "--addr", b, "-p", "18601", "-D", "120", "--timeout", "5s", "--progress", "0", a)
	cli.stdout.waitFor(t, "#bytes", 30*time.Second) // the run has begun
	require.NoError(t, cli.cmd.Process.Signal(syscall.SIGINT))
	cli.wait(t, 20*time.Second)
	srv := await(t, sdone, 20*time.Second) // failed here: the server never ended
	requireOneLineError(t, srv, "the peer disconnected")
	require.Equalf(t, 130, cli.code, "client: %s\n%s", cli.stdout, cli.stderrOf(t))
	require.Contains(t, cli.stderrOf(t), "rxed perf: interrupted (interrupt): closed the device and its connections")
}

// TestKilledRdmaCMClientEndsItsServer: a perf -R client killed outright
// (SIGKILL: no DREQ, nothing more on the wire, as when its host is lost)
// in the middle of its run; its server, idling on the control connection,
// probes it after --timeout with a keepalive that goes unanswered, and
// ends within --timeout plus the control QP's retries with one line
// saying the client stopped answering. Bug (newcomer walkthrough, item
// 1): the idle wait had no liveness check and the server waited for ever.
func TestKilledRdmaCMClientEndsItsServer(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	sout, _, sdone := startCmd("perf", "write", "-R", "--addr", a, "-p", "18602", "-D", "120", "--timeout", "2s", "--progress", "0")
	sout.waitFor(t, "Waiting for client to connect", 20*time.Second)
	cli := startProcess(t, "perf", "write", "-R", "--addr", b, "-p", "18602", "-D", "120", "--timeout", "5s", "--progress", "100ms", a)
	// The run is under way: the exchange before it is over and
	// acknowledged, so the server is idling on the control connection
	// (killed earlier, the client could leave the server's last barrier
	// SEND unacknowledged, whose retries end the server first).
	cli.stderr.waitFor(t, "iterations in", 30*time.Second)
	require.NoError(t, cli.cmd.Process.Kill())
	cli.wait(t, 20*time.Second)
	srv := await(t, sdone, 30*time.Second) // failed here: the server never ended
	requireOneLineError(t, srv, "rdma_cm control connection with "+b+":", "the peer stopped answering",
		"keepalive", "RETRY_EXC_ERR", "its process was killed or its host is gone")
	require.Equal(t, 1, srv.code)
}
