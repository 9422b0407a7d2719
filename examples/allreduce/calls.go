package allreduce

import (
	"context"
	"fmt"
)

// call is the AllReduce or Leave running on a Ring. Close cancels its
// context and waits for done before it frees the ring: over RDMA the call
// polls the CQ and posts to the QPs that Close destroys, and the engine
// reads Data and writes the slots for the WRITEs it has in flight, so
// freeing them under it raced the call (and its neighbour's WRITEs could
// land in a slot the ring had handed back). Once the call has returned,
// Close's own order (disconnect, destroy the QPs, whose destroy returns
// only when the engine has let go of them, then deregister the MRs)
// leaves nothing that touches released memory.
type call struct {
	name   string
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// begin registers a call of name and returns its context, which Close
// cancels; end must follow. On a closed ring, or while another call runs,
// it returns an error and registers nothing.
func (r *Ring) begin(ctx context.Context, name string) (context.Context, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, &closedError{r.cfg.Rank, name}
	}
	if r.running != nil {
		other := r.running.name
		r.mu.Unlock()
		return nil, fmt.Errorf("allreduce: rank %d: %s while %s runs (one call at a time)", r.cfg.Rank, name, other)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	r.running = &call{name: name, cancel: cancel, done: make(chan struct{})}
	r.mu.Unlock()
	hook(callBegun)
	return ctx, nil
}

// end unregisters the running call: Close may free the ring from now on.
func (r *Ring) end() {
	r.mu.Lock()
	c := r.running
	r.running = nil
	r.mu.Unlock()
	c.cancel(nil)
	close(c.done)
}

// stopRunning marks the ring closed, so no call starts any more, and
// stops the running call, if any, returning once it has returned. The
// call's error wraps ErrClosed: the ring ended by this rank's own doing,
// which is neither a neighbour's failure nor the caller's cancellation
// (ring.stepErr reports a context's cause over both).
func (r *Ring) stopRunning() {
	r.mu.Lock()
	r.closed = true
	c := r.running
	r.mu.Unlock()
	if c == nil {
		return
	}
	c.cancel(fmt.Errorf("Close called during %s: %w", c.name, ErrClosed))
	hook(closeWaitsForCall)
	<-c.done
}
