package daemon

import (
	"context"
	"log/slog"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/internal/testenv"
)

// closeTestConfig is a daemon with everything New opens: the device and
// its connection manager, an export, the perftest, rdma_cm and metrics
// listeners.
func closeTestConfig(t *testing.T, addr string) Config {
	return Config{Addrs: addrs(t, addr), OOBAddr: addr + ":0", RDMACMPort: DefaultRDMACMPort,
		MetricsAddr: addr + ":0", IdleTimeout: -1, ShutdownGrace: -1,
		Exports: []ExportSpec{{Name: "data", Kind: ExportAnon, Size: 1 << 16}}}
}

// requireRefused checks that nothing listens on a freed TCP address.
func requireRefused(t *testing.T, a net.Addr) {
	t.Helper()
	c, err := net.Dial("tcp", a.String())
	if err == nil {
		c.Close()
	}
	require.Error(t, err, "%v still accepts connections", a)
}

// TestCloseBeforeRunFreesWhatNewOpened: a daemon that New opened and that
// never runs is freed by Close: no goroutine of the daemon, its device or
// its listeners is left, its TCP listeners are gone, a second Close is
// nil, a later Run returns ErrClosed and the metrics page reads nothing
// of the closed device. Bug (lifetime audit, session AH): only Run's
// shutdown released what New opened (release was unexported), so an
// embedder that called New and then did not Run could free nothing.
func TestCloseBeforeRunFreesWhatNewOpened(t *testing.T) {
	leaks := testenv.SnapshotGoroutines(rxedPkgs...)
	d, err := New(closeTestConfig(t, "127.0.3.229"))
	require.NoError(t, err)
	oob, metrics := d.OOBAddr(), d.MetricsAddr()
	require.NoError(t, d.Close())
	leaks.CheckNoneLeft(t)
	requireRefused(t, oob)
	requireRefused(t, metrics)
	require.NoError(t, d.Close(), "a second Close")
	require.ErrorIs(t, d.Run(context.Background()), ErrClosed)
	require.Contains(t, d.Metrics(), errStopped.Error())
}

// TestCloseDuringRunEndsRun: Close during Run is cancelling Run's
// context and waiting for it: Run returns, Close returns its result
// once it has, and nothing of the daemon is left; a Close after Run is
// nil. Bug (lifetime audit, session AH): there was no Close.
func TestCloseDuringRunEndsRun(t *testing.T) {
	leaks := testenv.SnapshotGoroutines(rxedPkgs...)
	logs := newLogWatch()
	cfg := closeTestConfig(t, "127.0.3.230")
	cfg.Logger = slog.New(logs)
	d, err := New(cfg)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- d.Run(context.Background()) }()
	logs.waitFor(t, "serving", 1) // Run has started
	require.NoError(t, d.Close())
	// Run's shutdown is over as Close returns (Run's own return may
	// still be on its way to done).
	requireRefused(t, d.OOBAddr())
	requireRefused(t, d.MetricsAddr())
	require.NoError(t, <-done)
	leaks.CheckNoneLeft(t)
	require.NoError(t, d.Close(), "Close after Run")
	require.ErrorIs(t, d.Run(context.Background()), ErrClosed)
}
