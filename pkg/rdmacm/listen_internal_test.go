package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
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

// TestBacklogRefusalLeavesNoConn: a REQ that finds the listener's backlog
// full is refused (REJ) and leaves nothing behind in the agent. Bug (found
// by an audit of error paths, session AE): the Conn made for it stayed in
// the agent's live set until the device closed, one per refused REQ, so a
// peer sending REQs faster than the application accepted grew it without
// bound.
func TestBacklogRefusalLeavesNoConn(t *testing.T) {
	net := transport.NewMemNetwork()
	srv, cli := MemDevice(t, net, "10.0.5.1"), MemDevice(t, net, "10.0.5.2")
	l, err := Listen(srv, netip.MustParseAddrPort("10.0.5.1:7000"), &ListenOptions{Backlog: 1})
	require.NoError(t, err)
	defer l.Close()
	a := running(srv)
	pd, err := cli.AllocPD()
	require.NoError(t, err)
	cq, err := cli.CreateCQ(64)
	require.NoError(t, err)
	newQP := func() *ib.QP {
		q, err := pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
			Cap: ib.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
		require.NoError(t, err)
		return q
	}
	// The first request fills the backlog and waits there (nobody accepts).
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		_, err := Dial(ctx, newQP(), l.Addr(), nil)
		first <- err
	}()
	for len(l.reqs) == 0 {
		runtime.Gosched()
	}
	const refused = 20
	for i := range refused {
		_, err := Dial(context.Background(), newQP(), l.Addr(), nil)
		var rej *RejectError
		require.True(t, errors.As(err, &rej), "dial %d: %v", i, err)
	}
	// The REJ reaches the dialer before the handler that sent it returns.
	require.Eventually(t, func() bool { return liveConns(a) == 1 }, 10*time.Second, time.Millisecond,
		"the agent keeps %d connections for 1 queued request after %d refusals", liveConns(a), refused)
	cancel()
	require.ErrorIs(t, <-first, context.Canceled)
}

func liveConns(a *agent) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.live)
}
