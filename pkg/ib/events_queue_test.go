package ib_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// eventKey names an event by its type and the object it is of, for
// comparing sequences.
func eventKey(ev ib.AsyncEvent) string {
	switch {
	case ev.CQ != nil:
		return fmt.Sprintf("%v cq %p", ev.Type, ev.CQ)
	case ev.SRQ != nil:
		return fmt.Sprintf("%v srq %p", ev.Type, ev.SRQ)
	case ev.Type == ib.EventPortActive:
		return fmt.Sprintf("%v port %d", ev.Type, ev.Port)
	}
	return fmt.Sprintf("%v qp %#x", ev.Type, ev.QPN)
}

// readEvents reads n events off d.Events, failing after closeBound
// without one.
func readEvents(t *testing.T, d *ib.Device, n int) []string {
	t.Helper()
	got := make([]string, 0, n)
	for range n {
		select {
		case ev := <-d.Events():
			got = append(got, eventKey(ev))
		case <-time.After(closeBound):
			t.Fatalf("%d events read, the next did not come within %v", len(got), closeBound)
		}
	}
	return got
}

// unreadEvents returns, without waiting on the engine, the events p's
// device has not yielded yet: it raises a marker on a QP of its own and
// reads up to it. (A select with a default case would miss an event the
// device's goroutine has not offered yet, and asking the queue would
// race with that goroutine noting the last read.)
func unreadEvents(t *testing.T, p *peer) []ib.AsyncEvent {
	t.Helper()
	marker := p.createQP(ib.RC)
	defer func() { require.NoError(t, marker.Destroy()) }()
	ib.RaiseQPEvent(marker, ib.EventSQDrained)
	var evs []ib.AsyncEvent
	for {
		select {
		case ev := <-p.dev.Events():
			if ev.Type == ib.EventSQDrained && ev.QPN == marker.Num() {
				return evs
			}
			evs = append(evs, ev)
		case <-time.After(closeBound):
			t.Fatalf("the marker did not come within %v", closeBound)
		}
	}
}

// An application that reads nothing while 1200 events are raised then
// reads every one, in the order raised, and no more. Bug (event audit,
// left by session HCQ): Device.Events was a 64-event buffer that dropped
// every event raised while it was full, where the kernel queues them all
// (ib_uverbs_async_handler appends to an unbounded list).
func TestEventsQueuedUntilReadInOrder(t *testing.T) {
	p := openPeer(transport.NewMemNetwork(), "10.9.9.1")
	defer p.close()
	full, err := p.dev.CreateCQ(1)
	require.NoError(t, err)
	require.NoError(t, ib.PushAsEngine(full, ib.WC{ID: 1}), "fills the CQ")
	qps := []*ib.QP{p.createQP(ib.RC), p.createQP(ib.RC), p.createQP(ib.UD)}
	types := []ib.EventType{ib.EventCommEst, ib.EventQPFatal, ib.EventSQDrained}

	want := []string{eventKey(ib.AsyncEvent{Type: ib.EventPortActive, Port: 1})}
	for i := range 1200 {
		if i%4 == 3 {
			require.ErrorIs(t, ib.PushAsEngine(full, ib.WC{ID: uint64(i)}), ib.ErrCQOverflow)
			want = append(want, eventKey(ib.AsyncEvent{Type: ib.EventCQErr, CQ: full}))
			continue
		}
		q, typ := qps[i%len(qps)], types[(i/len(qps))%len(types)]
		ib.RaiseQPEvent(q, typ)
		want = append(want, eventKey(ib.AsyncEvent{Type: typ, QPN: q.Num()}))
	}
	require.Len(t, ib.QueuedEvents(p.dev), len(want), "every event is held until read")
	require.Equal(t, want, readEvents(t, p.dev, len(want)))
	require.Empty(t, unreadEvents(t, p))
}

// Events raised by several goroutines at once (engine workers raise them)
// are all delivered, each goroutine's in the order it raised them, while
// the application reads. -race checks the queue's hand-over.
func TestEventsFromConcurrentRaisers(t *testing.T) {
	p := openPeer(transport.NewMemNetwork(), "10.9.9.2")
	defer p.close()
	require.Equal(t, ib.EventPortActive, (<-p.dev.Events()).Type)
	const raisers, each = 4, 300
	qps := make([]*ib.QP, raisers)
	for i := range qps {
		qps[i] = p.createQP(ib.RC)
	}
	var wg sync.WaitGroup
	for _, q := range qps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				// Alternating types: each raiser's order shows in them.
				ib.RaiseQPEvent(q, []ib.EventType{ib.EventCommEst, ib.EventSQDrained}[i%2])
			}
		}()
	}
	seen := map[uint32]int{}
	for range raisers * each {
		select {
		case ev := <-p.dev.Events():
			n := seen[ev.QPN]
			require.Equal(t, []ib.EventType{ib.EventCommEst, ib.EventSQDrained}[n%2], ev.Type, "QP %#x's event %d", ev.QPN, n)
			seen[ev.QPN] = n + 1
		case <-time.After(closeBound):
			t.Fatalf("only %v arrived within %v", seen, closeBound)
		}
	}
	wg.Wait()
	for _, q := range qps {
		require.Equal(t, each, seen[q.Num()])
	}
	require.Empty(t, unreadEvents(t, p))
}

// Destroying a QP, a CQ or an SRQ drops its events not yet read, as the
// kernel's destroys free the object's entries of the async event list
// (ib_uverbs_release_uevent, ib_uverbs_release_ucq); the other objects'
// events stay, in order. Bug (event audit, left by session HCQ): a
// destroyed object's events were still delivered.
func TestDestroyDropsUnreadEvents(t *testing.T) {
	p := openPeer(transport.NewMemNetwork(), "10.9.9.3")
	defer p.close()
	qa, qb := p.createQP(ib.RC), p.createQP(ib.RC)
	ca, err := p.dev.CreateCQ(1)
	require.NoError(t, err)
	cb, err := p.dev.CreateCQ(1)
	require.NoError(t, err)
	newSRQ := func() *ib.SRQ {
		s, err := p.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 8, MaxSGE: 1})
		require.NoError(t, err)
		return s
	}
	sa, sb := newSRQ(), newSRQ()
	for _, cq := range []*ib.CQ{ca, cb} {
		require.NoError(t, ib.PushAsEngine(cq, ib.WC{}))
	}
	// limitReached makes s raise SRQ_LIMIT_REACHED as a QP taking a
	// receive below the armed limit does.
	limitReached := func(s *ib.SRQ) {
		require.NoError(t, s.PostRecv(ib.RecvWR{SGL: []ib.SGE{p.sge(0, 8)}}))
		require.NoError(t, s.ArmLimit(1))
		require.True(t, ib.TakeSRQ(s))
	}

	var want []string
	for range 3 {
		ib.RaiseQPEvent(qa, ib.EventCommEst)
		ib.RaiseQPEvent(qb, ib.EventCommEst)
		require.ErrorIs(t, ib.PushAsEngine(ca, ib.WC{}), ib.ErrCQOverflow)
		require.ErrorIs(t, ib.PushAsEngine(cb, ib.WC{}), ib.ErrCQOverflow)
		limitReached(sa)
		limitReached(sb)
		want = append(want, eventKey(ib.AsyncEvent{Type: ib.EventCommEst, QPN: qb.Num()}),
			eventKey(ib.AsyncEvent{Type: ib.EventCQErr, CQ: cb}),
			eventKey(ib.AsyncEvent{Type: ib.EventSRQLimitReached, SRQ: sb}))
	}
	require.Len(t, ib.QueuedEvents(p.dev), 1+6*3)
	require.NoError(t, qa.Destroy())
	require.NoError(t, ca.Destroy())
	require.NoError(t, sa.Destroy())

	require.Equal(t, ib.EventPortActive, (<-p.dev.Events()).Type)
	require.Equal(t, want, readEvents(t, p.dev, len(want)))
	require.Empty(t, unreadEvents(t, p), "none of the destroyed objects' events is left")
}

// The event Events is offering when its object is destroyed (the device's
// goroutine holds it, waiting for a reader) is dropped too: the next read
// yields the event after it. Each kind of object in turn.
func TestDestroyDropsTheEventBeingOffered(t *testing.T) {
	p := openPeer(transport.NewMemNetwork(), "10.9.9.4")
	defer p.close()
	require.Equal(t, ib.EventPortActive, (<-p.dev.Events()).Type)
	marker := p.createQP(ib.RC)
	// next raises ev with raise, then an event of marker's, waits until
	// Events offers ev and destroys ev's object: the next read is the
	// marker's.
	next := func(ev ib.AsyncEvent, raise func(), destroy func() error) {
		t.Helper()
		raise()
		ib.RaiseQPEvent(marker, ib.EventCommEst)
		offered := make(chan struct{})
		go func() { ib.WaitOffering(p.dev, ev); close(offered) }()
		select {
		case <-offered:
		case <-time.After(closeBound):
			t.Fatalf("%v was not offered within %v", ev.Type, closeBound)
		}
		require.NoError(t, destroy())
		got := readEvents(t, p.dev, 1)
		require.Equal(t, []string{eventKey(ib.AsyncEvent{Type: ib.EventCommEst, QPN: marker.Num()})}, got,
			"the destroyed object's %v was read", ev.Type)
	}
	q := p.createQP(ib.RC)
	next(ib.AsyncEvent{Type: ib.EventQPFatal, QPN: q.Num()}, func() { ib.RaiseQPEvent(q, ib.EventQPFatal) }, q.Destroy)
	cq, err := p.dev.CreateCQ(1)
	require.NoError(t, err)
	require.NoError(t, ib.PushAsEngine(cq, ib.WC{}))
	next(ib.AsyncEvent{Type: ib.EventCQErr, CQ: cq}, func() {
		require.ErrorIs(t, ib.PushAsEngine(cq, ib.WC{}), ib.ErrCQOverflow)
	}, cq.Destroy)
	srq, err := p.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 2, MaxSGE: 1})
	require.NoError(t, err)
	next(ib.AsyncEvent{Type: ib.EventSRQLimitReached, SRQ: srq}, func() {
		require.NoError(t, srq.PostRecv(ib.RecvWR{SGL: []ib.SGE{p.sge(0, 8)}}))
		require.NoError(t, srq.ArmLimit(1))
		require.True(t, ib.TakeSRQ(srq))
	}, srq.Destroy)
	require.Empty(t, unreadEvents(t, p))
}

// Device.Close with events nobody read returns, drops them and leaves no
// goroutine behind (the one feeding Events is joined); Events then stays
// open and yields nothing, and a later event is not queued.
func TestDeviceCloseWithUnreadEvents(t *testing.T) {
	leaks := testenv.SnapshotGoroutines(testenv.StackPackages()...)
	p := openPeer(transport.NewMemNetwork(), "10.9.9.5")
	q := p.createQP(ib.RC)
	for range 100 {
		ib.RaiseQPEvent(q, ib.EventCommEst)
	}
	closed := make(chan error, 1)
	go func() { closed <- p.dev.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(closeBound):
		t.Fatalf("Close with unread events did not return within %v", closeBound)
	}
	leaks.CheckNoneLeft(t)

	require.Empty(t, ib.QueuedEvents(p.dev), "the unread events went with the device")
	ib.RaiseQPEvent(q, ib.EventQPFatal)
	require.Empty(t, ib.QueuedEvents(p.dev), "nothing is queued after Close")
	// Close joined the goroutine that sends on Events: nothing can come.
	select {
	case ev := <-p.dev.Events():
		t.Fatalf("Events yielded %v after Close", ev.Type)
	default:
	}
	require.NoError(t, q.Destroy())
}
