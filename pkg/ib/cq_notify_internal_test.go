package ib

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/stretchr/testify/require"
)

// These tests push completions straight into the qp.CQ (the engine's
// path without the engine), so that each step is an event the test
// controls; the runner's exit is observed through notify.onIdle.

const notifyWait = 10 * time.Second

// blockingHandler records each call's first polled completion on entered
// and returns when release is sent to.
type blockingHandler struct {
	calls   atomic.Int32
	entered chan uint64
	release chan struct{}
	idle    chan struct{}
}

func newBlockingHandler(t *testing.T, cq *CQ) *blockingHandler {
	h := &blockingHandler{entered: make(chan uint64, 8), release: make(chan struct{}), idle: make(chan struct{}, 8)}
	cq.notify.onIdle = func() { h.idle <- struct{}{} }
	require.NoError(t, cq.SetNotifyHandler(func(c *CQ) {
		h.calls.Add(1)
		var wc [1]WC
		c.Poll(wc[:])
		h.entered <- wc[0].ID
		<-h.release
	}))
	return h
}

// wait receives from ch or fails the test after notifyWait.
func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(notifyWait):
		t.Fatalf("%s did not happen within %v", what, notifyWait)
		panic("unreachable")
	}
}

func notifyOnce(t *testing.T, cq *CQ, id uint64) {
	t.Helper()
	require.NoError(t, cq.ReqNotify(false))
	require.NoError(t, cq.c.Push(WC{ID: id}))
}

// Notifications that fire while the handler runs coalesce into one more
// call; the calls run one after the other.
func TestNotifyHandlerCoalesces(t *testing.T) {
	cq, err := new(Device).CreateCQ(8)
	require.NoError(t, err)
	h := newBlockingHandler(t, cq)

	notifyOnce(t, cq, 1)
	require.Equal(t, uint64(1), wait(t, h.entered, "the first call"))
	notifyOnce(t, cq, 2)
	notifyOnce(t, cq, 3)
	require.Equal(t, uint64(3), cq.Notifications())
	h.release <- struct{}{}
	require.Equal(t, uint64(2), wait(t, h.entered, "the call for the coalesced notifications"))
	h.release <- struct{}{}
	wait(t, h.idle, "the runner's exit")
	require.Equal(t, int32(2), h.calls.Load(), "three notifications, two calls")
	require.Equal(t, 1, cq.Len(), "completion 3 is left for the next poll")
}

// After Destroy returns no call starts, not even for a notification that
// fired before; the call in progress finishes on its own.
func TestNotifyHandlerStopsOnDestroy(t *testing.T) {
	cq, err := new(Device).CreateCQ(8)
	require.NoError(t, err)
	h := newBlockingHandler(t, cq)

	notifyOnce(t, cq, 1)
	wait(t, h.entered, "the first call")
	notifyOnce(t, cq, 2) // pending behind the running call
	require.NoError(t, cq.Destroy())
	h.release <- struct{}{}
	wait(t, h.idle, "the runner's exit")
	require.Equal(t, int32(1), h.calls.Load(), "a call started after Destroy")

	require.ErrorIs(t, cq.ReqNotify(false), ErrDestroyed)
	require.ErrorIs(t, cq.c.Push(WC{ID: 3}), qp.ErrCQClosed)
	var wcs [4]WC
	require.Equal(t, 1, cq.Poll(wcs[:]), "queued completions stay pollable")
	require.Equal(t, uint64(2), wcs[0].ID)
	require.ErrorIs(t, cq.SetNotifyHandler(func(*CQ) {}), ErrDestroyed)
}

// A handler may destroy its own CQ and remove itself: neither waits for
// the call they are made from.
func TestNotifyHandlerDestroysItsCQ(t *testing.T) {
	cq, err := new(Device).CreateCQ(8)
	require.NoError(t, err)
	idle := make(chan struct{}, 1)
	cq.notify.onIdle = func() { idle <- struct{}{} }
	results := make(chan error, 2)
	require.NoError(t, cq.SetNotifyHandler(func(c *CQ) {
		results <- c.SetNotifyHandler(nil)
		results <- c.Destroy()
	}))
	notifyOnce(t, cq, 1)
	require.NoError(t, wait(t, results, "SetNotifyHandler(nil) in the handler"))
	require.NoError(t, wait(t, results, "Destroy in the handler"))
	wait(t, idle, "the runner's exit")
}

// nil removes the handler: a notification then starts nothing (the
// qp-level handler is gone, so this is decided inside Push); a new
// handler is called again.
func TestNotifyHandlerRemoved(t *testing.T) {
	cq, err := new(Device).CreateCQ(8)
	require.NoError(t, err)
	h := newBlockingHandler(t, cq)
	require.NoError(t, cq.SetNotifyHandler(nil))
	notifyOnce(t, cq, 1)
	cq.notify.mu.Lock()
	running, pending := cq.notify.running, cq.notify.pending
	cq.notify.mu.Unlock()
	require.False(t, running)
	require.False(t, pending)
	require.Zero(t, h.calls.Load())
	require.Equal(t, uint64(1), cq.Notifications(), "the notification fired, to no handler")

	called := make(chan int, 1)
	require.NoError(t, cq.SetNotifyHandler(func(c *CQ) {
		var wcs [4]WC
		called <- c.Poll(wcs[:])
	}))
	notifyOnce(t, cq, 2)
	require.Equal(t, 2, wait(t, called, "the new handler's call"))
	wait(t, h.idle, "the runner's exit")
}

// BenchmarkNotifyHandler: one notification from Push to the handler's
// call on its goroutine and back (the runner starts per burst; each op
// here is a burst of one, the worst case).
func BenchmarkNotifyHandler(b *testing.B) {
	cq, err := new(Device).CreateCQ(4)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{}, 1)
	if err := cq.SetNotifyHandler(func(c *CQ) {
		var wc [1]WC
		c.Poll(wc[:])
		done <- struct{}{}
	}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := cq.ReqNotify(false); err != nil {
			b.Fatal(err)
		}
		if err := cq.c.Push(WC{ID: 1}); err != nil {
			b.Fatal(err)
		}
		<-done
	}
}
