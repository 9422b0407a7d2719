package daemon

import (
	"context"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/internal/testenv"
)

// rxedPkgs are the packages whose goroutines a daemon starts, directly or
// through its device, listeners and connection manager.
var rxedPkgs = testenv.StackPackages("github.com/rxed/rxed/internal/daemon", "github.com/rxed/rxed/pkg/oob")

// TestRunLeavesNoGoroutine: once Run has returned, the idle reaper has
// ended, and no goroutine of the daemon, its device or its listeners is
// left. The reaper is held inside a scan (its injected Now) until
// shutdown starts waiting for it, so a Run that does not wait returns
// with it still there, every time. Bug (goroutine audit, session AG):
// reapLoop was started by the accept loop and ended with sessCtx, but
// nothing waited for it, so it outlived Run (and it ticked on a real
// ticker while reading the injected Now: Config.Ticker now paces it).
func TestRunLeavesNoGoroutine(t *testing.T) {
	leaks := testenv.SnapshotGoroutines(rxedPkgs...)
	gate := make(chan struct{})
	var gateOnce atomic.Bool
	open := func() {
		if gateOnce.CompareAndSwap(false, true) {
			close(gate)
		}
	}
	t.Cleanup(open)
	scanning := make(chan struct{}, 1)
	now := func() time.Time {
		buf := make([]byte, 1<<14)
		if strings.Contains(string(buf[:runtime.Stack(buf, false)]), "(*Daemon).reapLoop(") {
			scanning <- struct{}{}
			<-gate
		}
		return time.Now()
	}
	tick := make(chan time.Time)
	var reaperStopped atomic.Bool
	d, err := New(Config{Addrs: addrs(t, "127.0.3.227"), OOBAddr: "127.0.3.227:0", RDMACMPort: DefaultRDMACMPort,
		MetricsAddr: "127.0.3.227:0", IdleTimeout: time.Hour, ShutdownGrace: -1, Now: now,
		Ticker: func(time.Duration) (<-chan time.Time, func()) {
			return tick, func() { reaperStopped.Store(true) }
		},
		Exports: []ExportSpec{{Name: "data", Kind: ExportAnon, Size: 1 << 16}}})
	require.NoError(t, err)
	d.awaitingReaper = open
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	tick <- time.Now() // the reaper's first scan, held in Now
	<-scanning
	cancel()
	require.NoError(t, <-done)
	require.True(t, reaperStopped.Load(), "Run returned with the idle reaper still running")
	leaks.CheckNoneLeft(t)
}

// TestRunWaitsForItsRefusals: Run returns only once the goroutine telling
// a refused client so has ended. The refusal is held at its end until
// shutdown starts waiting for it, so a Run that does not wait returns
// with it still there, every time. Bug (goroutine audit, session AG):
// refuse's goroutines ended with sessCtx (or their own bound) and nothing
// joined them.
func TestRunWaitsForItsRefusals(t *testing.T) {
	gate := make(chan struct{})
	var gateOnce atomic.Bool
	open := func() {
		if gateOnce.CompareAndSwap(false, true) {
			close(gate)
		}
	}
	t.Cleanup(open)
	d, err := New(Config{Addrs: addrs(t, "127.0.3.228"), OOBAddr: "127.0.3.228:0", IdleTimeout: -1, ShutdownGrace: -1,
		MaxSessions: 1, HandshakeTimeout: time.Minute,
		Exports: []ExportSpec{{Name: "data", Kind: ExportAnon, Size: 1 << 16}}})
	require.NoError(t, err)
	refusing := make(chan struct{})
	var refusalEnded atomic.Bool
	d.refused = func() {
		close(refusing)
		<-gate
		refusalEnded.Store(true)
	}
	d.awaitingRefusals = open
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	// The first client takes the only slot (the accept loop admits in
	// the order the connections were made); the second is refused, and
	// its refusal ends at once as it hangs up.
	var dl net.Dialer
	first, err := dl.DialContext(context.Background(), "tcp", d.OOBAddr().String())
	require.NoError(t, err)
	defer first.Close()
	second, err := dl.DialContext(context.Background(), "tcp", d.OOBAddr().String())
	require.NoError(t, err)
	second.Close()
	<-refusing
	cancel()
	require.NoError(t, <-done)
	require.True(t, refusalEnded.Load(), "Run returned with a refusal's goroutine still running")
}
