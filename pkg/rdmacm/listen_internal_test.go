package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm/cmtest"
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

	open := &Listener{reqs: newBacklog(1, 0), closed: make(chan struct{})}
	r1, r2 := &Request{}, &Request{}
	require.True(t, open.offer(r1, fail))
	require.False(t, open.offer(r2, fail), "a full queue refuses (the handler sends REJ)")
	require.Same(t, r1, open.reqs.pop())

	closed := &Listener{reqs: newBacklog(4, 0), closed: make(chan struct{})}
	close(closed.closed)
	closed.rejectQueued(reject) // Close's drain, before the request came
	require.True(t, closed.offer(r2, reject))
	require.Equal(t, []*Request{r2}, rejected)
	require.Zero(t, closed.reqs.queued())
}

// TestFullBacklogLeavesNoConn: a REQ that finds the listener's backlog
// full leaves nothing behind in the agent: it is dropped without a REJ
// before rdma_cm makes a Conn for it (its retransmission is a new
// request, TestFullBacklogDropsTheREQUntilThereIsRoom). Bug (found by an
// audit of error paths, session AE): the Conn made for a REQ refused
// there stayed in the agent's live set until the device closed, one per
// refused REQ, so a peer sending REQs faster than the application
// accepted grew it without bound. The CM clocks stand still: no REQ is
// retransmitted.
func TestFullBacklogLeavesNoConn(t *testing.T) {
	net := transport.NewMemNetwork()
	srv, cli := MemDevice(t, net, "10.0.5.1"), MemDevice(t, net, "10.0.5.2")
	fc := cmtest.NewFakeClock(time.Unix(5_000_000, 0))
	require.NoError(t, Enable(srv, &Config{Clock: fc}))
	require.NoError(t, Enable(cli, &Config{Clock: fc}))
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
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	dial := func() {
		q := newQP()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := Dial(ctx, q, l.Addr(), nil)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("a Dial waiting for the listener ended with %v", err)
			}
		}()
	}
	// The first request fills the backlog and waits there (nobody accepts).
	dial()
	require.Eventually(t, func() bool { return l.reqs.queued() == 1 }, 10*time.Second, time.Millisecond)
	const dropped = 20
	for range dropped {
		dial()
	}
	require.Eventually(t, func() bool { c := Counters(srv); return c["req_dropped"]+c["tx_rej"] == dropped },
		10*time.Second, time.Millisecond, "the REQs over the backlog were neither dropped nor refused")
	require.Zero(t, Counters(srv)["tx_rej"], "REQs over the backlog refused")
	require.Equal(t, 1, liveConns(a), "the agent keeps %d connections for 1 queued request after %d drops", liveConns(a), dropped)
}

func liveConns(a *agent) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.live)
}
