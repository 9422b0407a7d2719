package daemon

import (
	"context"
	"errors"
)

// ErrClosed is Run's error on a daemon already closed.
var ErrClosed = errors.New("daemon: closed")

// runState is where a daemon is in its life: New opened it, Run serves
// it, and once Run has returned (or Close freed it unrun) it is closed.
type runState int

const (
	stateOpen runState = iota
	stateRunning
	stateClosed
)

// Close frees the daemon whatever its state, and is idempotent:
//
//   - before Run: it frees what New opened (the device, exports,
//     listeners; file-backed exports are msynced, and an msync or unmap
//     error is returned) and a later Run returns ErrClosed;
//   - during Run: it is cancelling Run's context and waiting for Run to
//     return (the whole graceful shutdown, ShutdownGrace included), and
//     it returns what Run returns;
//   - after Run (or a second time): nil.
//
// An embedder that calls New and then does not Run (or whose Run never
// started) would otherwise have no way to free anything: only Run's
// shutdown released it.
func (d *Daemon) Close() error {
	d.runMu.Lock()
	switch d.runState {
	case stateOpen:
		d.runState = stateClosed
		d.runMu.Unlock()
		return d.release()
	case stateRunning:
		cancel, done := d.runCancel, d.runDone
		d.runMu.Unlock()
		cancel()
		<-done
		return d.runErr
	default:
		d.runMu.Unlock()
		return nil
	}
}

// startRun moves an open daemon to running and returns the context Run
// serves under, which Close can end.
func (d *Daemon) startRun(ctx context.Context) (context.Context, error) {
	d.runMu.Lock()
	defer d.runMu.Unlock()
	switch d.runState {
	case stateClosed:
		return nil, ErrClosed
	case stateRunning:
		return nil, errors.New("daemon: Run called while it runs")
	}
	d.runState = stateRunning
	ctx, d.runCancel = context.WithCancel(ctx)
	d.runDone = make(chan struct{})
	return ctx, nil
}

// endRun records Run's result and wakes the Closes waiting for it.
func (d *Daemon) endRun(err error) {
	d.runMu.Lock()
	defer d.runMu.Unlock()
	d.runErr = err
	d.runState = stateClosed
	d.runCancel()
	close(d.runDone)
}
