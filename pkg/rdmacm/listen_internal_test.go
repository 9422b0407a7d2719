package rdmacm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestListenerClosedBeforeItsRequestWasQueued: a request queued after
// the listener's Close drained its queue is answered at once, not left
// for an Accept that never comes. Bug (found by an audit of hangs on
// close, session AE): the CM's handler routes a request to a listener,
// Close runs (closed, out of the agent, queue drained), then the handler
// queues the request: it stayed half open in the CM for good and its
// peer waited out the REQ's retries.
func TestListenerClosedBeforeItsRequestWasQueued(t *testing.T) {
	var rejected []*Request
	reject := func(r *Request) { rejected = append(rejected, r) }
	fail := func(r *Request) { t.Fatalf("request %p refused by an open listener", r) }

	open := &Listener{reqs: make(chan *Request, 1), closed: make(chan struct{})}
	r1, r2 := &Request{}, &Request{}
	require.True(t, open.offer(r1, fail))
	require.False(t, open.offer(r2, fail), "a full queue refuses (the handler sends REJ)")
	require.Same(t, r1, <-open.reqs)

	closed := &Listener{reqs: make(chan *Request, 4), closed: make(chan struct{})}
	close(closed.closed)
	closed.rejectQueued(reject) // Close's drain, before the request came
	require.True(t, closed.offer(r2, reject))
	require.Equal(t, []*Request{r2}, rejected)
	require.Empty(t, closed.reqs)
}
