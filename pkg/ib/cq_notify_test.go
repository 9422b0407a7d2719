package ib_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// handlerWait bounds how long a test waits for a handler; a deadlocked
// handler fails the test after it instead of hanging it.
const handlerWait = 20 * time.Second

// verbsInHandler is what a handler saw when it called verbs.
type verbsInHandler struct {
	polled       []ib.WC
	queried      ib.QPAttr
	queryErr     error
	modifyErr    error
	createErr    error
	destroyErr   error
	stateAfterwd ib.QPState
}

// A handler may call the verbs that wait for the engine on the QP whose
// completion fired: Query, Modify to ERR, and CreateQP / Destroy of
// another QP on the same (only) worker. With the handler inside the
// engine, the first of them would wait for the worker running it.
func TestNotifyHandlerMayCallEngineVerbs(t *testing.T) {
	a, qa, b, qb := rcPair()
	// The devices are closed at the end, not deferred: closing b's engine
	// waits for its worker, which a deadlocked handler would hold forever,
	// and the test must fail rather than hang.

	got := make(chan verbsInHandler, 1)
	var calls atomic.Int32
	require.NoError(t, b.cq.SetNotifyHandler(func(cq *ib.CQ) {
		if calls.Add(1) > 1 {
			return // later calls: the flush completion's notification, if armed
		}
		var r verbsInHandler
		var wcs [4]ib.WC
		r.polled = append(r.polled, wcs[:cq.Poll(wcs[:])]...)
		r.queried, _, r.queryErr = qb.Query()
		r.modifyErr = qb.Modify(&ib.QPAttr{State: ib.QPSErr}, ib.AttrState)
		scratch, err := b.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
			Cap: ib.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
		r.createErr = err
		if err == nil {
			r.destroyErr = scratch.Destroy()
		}
		r.stateAfterwd = qb.State()
		got <- r
	}))

	require.NoError(t, b.cq.ReqNotify(false))
	require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{b.sge(0, 64)}}, ib.RecvWR{ID: 2, SGL: []ib.SGE{b.sge(64, 64)}}))
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 7, Opcode: ib.WRSend, Flags: ib.SendInline, Inline: []byte("modify me")}))

	var r verbsInHandler
	select {
	case r = <-got:
	case <-time.After(handlerWait):
		t.Fatalf("the handler did not finish within %v: a verb in it waits for the engine", handlerWait)
	}
	require.Len(t, r.polled, 1)
	require.Equal(t, uint64(1), r.polled[0].ID)
	require.Equal(t, ib.WCSuccess, r.polled[0].Status)
	require.NoError(t, r.queryErr)
	require.Equal(t, ib.QPSRTS, r.queried.State)
	require.NoError(t, r.modifyErr)
	require.NoError(t, r.createErr)
	require.NoError(t, r.destroyErr)
	require.Equal(t, ib.QPSErr, r.stateAfterwd)

	// The transition took effect: the second receive was flushed.
	wc := next(b.cq)
	require.Equal(t, uint64(2), wc.ID)
	require.Equal(t, ib.WCWRFlushErr, wc.Status)
	require.Equal(t, ib.QPSErr, qb.State())
	// Work posted in ERR is flushed.
	require.NoError(t, qb.PostSend(ib.SendWR{ID: 8, Opcode: ib.WRSend, Flags: ib.SendInline | ib.SendSignaled, Inline: []byte("x")}))
	wc = next(b.cq)
	require.Equal(t, uint64(8), wc.ID)
	require.Equal(t, ib.WCWRFlushErr, wc.Status)
	require.NoError(t, a.dev.Close())
	require.NoError(t, b.dev.Close())
}

// The handler that re-arms and then polls the CQ empty sees every
// completion of a burst exactly once, in order, and its calls never
// overlap.
func TestNotifyHandlerRearmSeesBurstOnce(t *testing.T) {
	a, b := peerPair(t, "10.7.0.1", "10.7.0.2")
	const n = 200
	cq, err := a.dev.CreateCQ(2 * n)
	require.NoError(t, err)
	qa, err := a.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: n, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	qb := b.createQP(ib.RC)
	connectBoth(a, qa, b, qb)

	var (
		inside, maxInside atomic.Int32
		calls             atomic.Int32
		order             []uint64 // only the handler appends; its calls are serialised
		bad               []ib.WC
		armErr            error
		all               = make(chan struct{})
		allOnce           sync.Once
	)
	require.NoError(t, cq.SetNotifyHandler(func(c *ib.CQ) {
		k := inside.Add(1)
		defer inside.Add(-1)
		if k > maxInside.Load() {
			maxInside.Store(k)
		}
		calls.Add(1)
		if err := c.ReqNotify(false); err != nil && armErr == nil {
			armErr = err
		}
		var wcs [8]ib.WC // smaller than a burst: several polls per call
		for {
			m := c.Poll(wcs[:])
			if m == 0 {
				break
			}
			for _, wc := range wcs[:m] {
				order = append(order, wc.ID)
				if wc.Status != ib.WCSuccess || wc.Opcode != ib.WCRDMAWrite {
					bad = append(bad, wc)
				}
			}
		}
		if len(order) >= n {
			allOnce.Do(func() { close(all) })
		}
	}))
	require.NoError(t, cq.ReqNotify(false))

	wrs := make([]ib.SendWR, n)
	for i := range wrs {
		wrs[i] = ib.SendWR{ID: uint64(i), Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
			SGL: []ib.SGE{a.sge(i*64, 64)}, RemoteAddr: b.mr.IOVA() + uint64(i*64), RKey: b.mr.RKey()}
	}
	require.NoError(t, qa.PostSend(wrs...))
	select {
	case <-all:
	case <-time.After(handlerWait):
		t.Fatalf("the handler saw %d of %d completions within %v", calls.Load(), n, handlerWait)
	}

	require.NoError(t, armErr)
	require.Empty(t, bad)
	want := make([]uint64, n)
	for i := range want {
		want[i] = uint64(i)
	}
	require.Equal(t, want, order, "every completion once, in order")
	require.Equal(t, int32(1), maxInside.Load(), "handler calls overlapped")
	require.LessOrEqual(t, uint64(calls.Load()), cq.Notifications(), "more calls than notifications fired")
	require.Zero(t, cq.Len())
}

// SetNotifyHandler is refused on a CQ of a completion channel and on a
// destroyed CQ.
func TestNotifyHandlerRefused(t *testing.T) {
	net := transport.NewMemNetwork()
	p := openPeer(net, "10.7.1.1")
	defer p.close()
	ch := p.dev.CreateCompChannel()
	ccq, err := p.dev.CreateCQOnChannel(4, ch)
	require.NoError(t, err)
	require.Error(t, ccq.SetNotifyHandler(func(*ib.CQ) {}))
	// The channel still gets the CQ's notifications.
	require.NoError(t, ccq.ReqNotify(false))
	require.NoError(t, ib.Push(ccq, ib.WC{ID: 1}))
	ctx, cancel := context.WithTimeout(context.Background(), handlerWait)
	defer cancel()
	got, err := ch.GetCQEvent(ctx)
	require.NoError(t, err, "the channel lost the notification")
	require.Same(t, ccq, got)

	cq, err := p.dev.CreateCQ(4)
	require.NoError(t, err)
	require.NoError(t, cq.Destroy())
	require.ErrorIs(t, cq.SetNotifyHandler(func(*ib.CQ) {}), ib.ErrDestroyed)
	require.ErrorIs(t, cq.SetNotifyHandler(nil), ib.ErrDestroyed)
}

// A notification handler runs on a goroutine of its own, not in the
// engine, so it may call any verb. The usual handler re-arms the CQ, then
// polls it empty: a completion that arrives after the poll fires the
// re-armed notification and so another call.
func ExampleCQ_SetNotifyHandler() {
	a, qa, b, qb := rcPair()
	defer a.close()
	defer b.close()

	received := make(chan ib.WC, 16)
	check(b.cq.SetNotifyHandler(func(cq *ib.CQ) {
		check(cq.ReqNotify(false))
		var wcs [8]ib.WC
		for n := cq.Poll(wcs[:]); n > 0; n = cq.Poll(wcs[:]) {
			for _, wc := range wcs[:n] {
				received <- wc
			}
		}
	}))
	check(b.cq.ReqNotify(false))
	check(qb.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{b.sge(0, 64)}}))
	check(qa.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRSend, Flags: ib.SendInline, Inline: []byte("hello")}))

	select {
	case wc := <-received:
		fmt.Println("handler polled", wc.Opcode, wc.Status.String(), wc.ByteLen, "bytes:", string(b.buf[:wc.ByteLen]))
	case <-time.After(20 * time.Second):
		panic("no notification")
	}
	// Output:
	// handler polled RECV SUCCESS 5 bytes: hello
}
