package ib

import "sync"

// closeHooks are functions to run when the device closes: services built
// on top of the verbs (a connection manager on QP 1, say) that live as
// long as the device.
type closeHooks struct {
	mu    sync.Mutex
	fns   []func()
	fired bool
}

// OnClose registers f to run when the device is closed, before its
// resources go away; hooks run in the reverse order of registration, on
// the goroutine that calls Close. On a closed device f runs at once. f
// must not call Close.
func (d *Device) OnClose(f func()) {
	h := &d.hooks
	h.mu.Lock()
	if h.fired {
		h.mu.Unlock()
		f()
		return
	}
	h.fns = append(h.fns, f)
	h.mu.Unlock()
}

// runCloseHooks runs the hooks once; later calls do nothing.
func (d *Device) runCloseHooks() {
	h := &d.hooks
	h.mu.Lock()
	fns := h.fns
	h.fns, h.fired = nil, true
	h.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}
