package roce

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// The shard-ownership rules of docs/DESIGN.md ("Ownership and locking"),
// tested directly: who may take a shard, when, and what the owner must
// do before it lets go.

// idleWorker is a worker of e's that runs no goroutine: the test plays
// its loop, so every state (queued events, owner) is the test's choice.
func idleWorker(t *testing.T) *worker {
	t.Helper()
	s := newSide(t, transport.NewMemNetwork(), "10.0.0.1", qp.RC)
	return newWorker(s.e, len(s.e.workers))
}

// workerRound is one round of worker.loop for a worker without a
// goroutine: take the shard, handle what is queued, settle, let go.
func workerRound(w *worker) {
	w.lockOwned()
	w.drain()
	w.settle()
	w.flush()
	w.own.Unlock()
}

// holdShard makes the test goroutine the inline owner of w's shard, as
// the receive loop does (tryAcquire with needIdle); it retries while the
// worker goroutine finishes what it was doing.
func holdShard(t *testing.T, w *worker) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !w.tryAcquire(true) {
		require.True(t, time.Now().Before(deadline), "the worker never went idle")
		runtime.Gosched()
	}
}

// TestInlineOwnerNeedsAnIdleShard: the receive loop and pollers
// (needIdle) take a shard only while no event is queued for it, so a
// packet they handle inline cannot overtake one queued before it (arrival
// order) nor a queued ModifyQP; a posting goroutine takes it regardless;
// nobody takes a shard that has an owner.
func TestInlineOwnerNeedsAnIdleShard(t *testing.T) {
	w := idleWorker(t)

	require.True(t, w.tryAcquire(true), "an idle shard")
	require.True(t, w.inline)
	require.False(t, w.tryAcquire(true), "a second owner")
	require.False(t, w.tryAcquire(false), "a second owner (posting)")
	other := make(chan bool)
	go func() { other <- w.tryInline(false, func() { t.Error("ran under another owner") }) }()
	require.False(t, <-other, "another goroutine while the shard is owned")
	w.releaseInline()
	require.False(t, w.inline)

	ran := false
	require.True(t, w.enqueue(event{kind: evCall, fn: func() { ran = true }}))
	require.Equal(t, int64(1), w.pending.Load())
	require.False(t, w.tryAcquire(true), "an event is queued: a packet must wait behind it")
	require.True(t, w.tryAcquire(false), "a posting goroutine may run a requester early")
	require.False(t, ran, "an inline owner does not take the worker's events")
	w.releaseInline()

	workerRound(w)
	require.True(t, ran)
	require.Zero(t, w.pending.Load(), "pending counts until the event is handled")
	require.True(t, w.tryAcquire(true), "idle again")
	w.releaseInline()
}

// TestWakesAndKicksDoNotHoldOffInlineOwners: an evWake (QPs left to run)
// or an evKick queued for the worker orders nothing, so it does not count
// in pending and the next packet is still handled inline. Before, a
// spinning application's poller queued every packet of a SEND ping-pong
// behind the evWake its previous round offered for its kept batch, and
// the round trip waited for the worker goroutine to be scheduled (with
// two spinners on two CPUs, until one of them yielded:
// BenchmarkSendLatency8 in poll mode grew with the interval between
// yields, 23 us at the median for a yield every 32 empty polls against
// 7.6 us with this rule).
func TestWakesAndKicksDoNotHoldOffInlineOwners(t *testing.T) {
	for _, k := range []struct {
		kind    eventKind
		ordered bool
	}{{evPacket, true}, {evCall, true}, {evKick, false}, {evWake, false}} {
		require.Equal(t, k.ordered, k.kind.ordered(), "kind %d", k.kind)
	}

	w := idleWorker(t)
	require.True(t, w.offer(event{kind: evWake}))
	w.kick(0x123)
	require.Equal(t, 2, len(w.events))
	require.Zero(t, w.pending.Load())
	require.True(t, w.tryAcquire(true), "a wake and a kick queued: a packet may still be handled inline")
	w.releaseInline()
	workerRound(w)
	require.Zero(t, len(w.events))
	require.Zero(t, w.pending.Load(), "handling them did not take pending below zero")

	ran := false
	require.True(t, w.offer(event{kind: evCall, fn: func() { ran = true }}))
	require.Equal(t, int64(1), w.pending.Load(), "a call counts")
	require.False(t, w.tryAcquire(true))
	workerRound(w)
	require.True(t, ran)
	require.Zero(t, w.pending.Load())
}

// TestPendingCoversAnEventBeingHandled: pending drops only once handle
// is done with an event, so the window between the worker dequeuing an
// event and handling it (when own is free) is not mistaken for idle.
func TestPendingCoversAnEventBeingHandled(t *testing.T) {
	w := idleWorker(t)
	seen := int64(-1)
	require.True(t, w.enqueue(event{kind: evCall, fn: func() { seen = w.pending.Load() }}))
	ev := <-w.events // dequeued, not handled: what loop holds while it waits for own
	require.Equal(t, int64(1), w.pending.Load())
	require.False(t, w.tryAcquire(true), "a dequeued event still counts")
	w.lockOwned()
	w.handle(ev)
	w.settle()
	w.own.Unlock()
	require.Equal(t, int64(1), seen, "pending while the event ran")
	require.Zero(t, w.pending.Load())
}

// TestKickWhileOwnedCostsNoEvent: a post that finds the shard owned
// records a kick, which the owner runs before it lets go (settle); once
// nobody owns the shard a kick queues one event, and repeated kicks
// coalesce.
func TestKickWhileOwnedCostsNoEvent(t *testing.T) {
	w := idleWorker(t)
	const qpn = 0x123
	require.True(t, w.tryAcquire(true))
	w.kick(qpn)
	w.kick(qpn)
	require.Zero(t, len(w.events), "the owner runs it: no event")
	require.Zero(t, w.pending.Load())
	w.kickMu.Lock()
	require.True(t, w.kicked.has(qpn))
	w.kickMu.Unlock()
	w.releaseInline()
	w.kickMu.Lock()
	require.True(t, w.kicked.empty(), "settle ran every kick")
	require.Zero(t, w.kstate.Load(), "no owner, nothing kicked")
	w.kickMu.Unlock()

	w.kick(qpn)
	w.kick(qpn)
	require.Equal(t, 1, len(w.events), "unowned: one event for both kicks")
	workerRound(w)
	require.Zero(t, w.pending.Load())
	w.kickMu.Lock()
	require.True(t, w.kicked.empty())
	w.kickMu.Unlock()
}

// TestKickRacingSettleIsNeverLost: a kick that races with the owner
// letting go of the shard is either run by the owner's settle or queued
// as an event, never left in kicked with neither (the kstate protocol:
// settle's compare-and-swap fails once kick has set kKicked). Run it
// with -race.
func TestKickRacingSettleIsNeverLost(t *testing.T) {
	w := idleWorker(t)
	const qpn = 0x123
	ranBySettle, queued := 0, 0
	for range 3000 {
		require.True(t, w.tryAcquire(true))
		kicked := make(chan struct{})
		go func() {
			w.kick(qpn)
			close(kicked)
		}()
		w.releaseInline()
		<-kicked
		w.kickMu.Lock()
		inSet, events := w.kicked.has(qpn), len(w.events)
		w.kickMu.Unlock()
		switch {
		case events == 1 && inSet:
			queued++
			workerRound(w)
		case events == 0 && !inSet:
			ranBySettle++
		default:
			t.Fatalf("kick lost or doubled: in kicked %v, %d events, kstate %b", inSet, events, w.kstate.Load())
		}
		require.Zero(t, w.kstate.Load()&kOwned, "no owner after the round")
	}
	t.Logf("%d kicks run by settle, %d queued as events", ranBySettle, queued)
}

// TestPostToAnOwnedShardIsSentByTheOwner drives the rule end to end: the
// test owns a's shard inline while another goroutine posts a SEND; the
// post returns without sending (nothing reaches b) and without an event,
// and the SEND leaves when the test lets the shard go.
func TestPostToAnOwnedShardIsSentByTheOwner(t *testing.T) {
	net := transport.NewMemNetwork()
	a := newSide(t, net, "10.0.0.1", qp.RC)
	b := newSide(t, net, "10.0.0.2", qp.RC)
	connect(t, a, b, qp.MTU1024, 14)
	rmr, rbuf := regMR(t, b, 64)
	_, err := b.e.PostRecv(b.q, []qp.RecvWR{{ID: 1, SGL: []qp.SGE{{Addr: rmr.IOVA(), Length: 64, LKey: rmr.LKey()}}}})
	require.NoError(t, err)

	w := a.e.workerFor(a.q.Num())
	holdShard(t, w)
	posted := make(chan error)
	go func() {
		_, err := a.e.PostSend(a.q, []qp.SendWR{{ID: 2, Opcode: qp.WRSend, Flags: qp.Signaled | qp.Inline,
			Inline: []byte("ping")}})
		posted <- err
	}()
	require.NoError(t, <-posted)
	require.Zero(t, len(w.events), "the post found the shard owned: a kick, no event")
	require.Zero(t, w.pending.Load())
	require.Zero(t, b.rcq.Len(), "nothing sent while the test owns the shard")
	require.Zero(t, w.txN, "the requester did not run")
	w.releaseInline()

	require.Equal(t, qp.WCSuccess, waitWC(t, b.rcq).Status)
	require.Equal(t, "ping", string(rbuf[:4]))
	require.Equal(t, qp.WCSuccess, waitWC(t, a.scq).Status)
}

// TestWorkerOwnsTheShardWhileHandling: while the worker goroutine handles
// an event nobody else may take its shard, and a post made meanwhile is
// sent by the worker before it lets go.
func TestWorkerOwnsTheShardWhileHandling(t *testing.T) {
	s := newSide(t, transport.NewMemNetwork(), "10.0.0.1", qp.RC)
	w := s.e.workers[0]
	type tries struct{ workerInline, idle, posting, inlineRan bool }
	var got tries
	require.NoError(t, w.call(func() {
		got.workerInline = w.inline // the worker goroutine is no inline owner
		done := make(chan tries)
		go func() {
			var r tries
			r.idle = w.tryAcquire(true)
			r.posting = w.tryInline(false, func() { r.inlineRan = true })
			done <- r
		}()
		r := <-done
		got.idle, got.posting, got.inlineRan = r.idle, r.posting, r.inlineRan
		w.kick(0x77) // a QP number nobody has: settle must still consume it
	}))
	require.Equal(t, tries{}, got, "nobody took the shard from the worker")
	holdShard(t, w) // the worker's round is over
	defer w.releaseInline()
	w.kickMu.Lock()
	defer w.kickMu.Unlock()
	require.True(t, w.kicked.empty(), "the worker ran the kick before it let go")
}

// TestInlineOwnerHoldsOffTheWorker: an event queued while an inline owner
// holds the shard is handled by the worker goroutine only after the owner
// let go, and the worker then is the only owner.
func TestInlineOwnerHoldsOffTheWorker(t *testing.T) {
	s := newSide(t, transport.NewMemNetwork(), "10.0.0.1", qp.RC)
	w := s.e.workers[0]
	holdShard(t, w)
	var released atomic.Bool
	type seen struct{ released, inline bool }
	ran := make(chan seen, 1)
	called := make(chan error, 1)
	go func() {
		called <- w.call(func() { ran <- seen{released.Load(), w.inline} })
	}()
	// Wait until the worker goroutine has taken the event off its inbox:
	// it now waits for the shard.
	deadline := time.Now().Add(10 * time.Second)
	for len(w.events) > 0 || w.pending.Load() == 0 {
		require.True(t, time.Now().Before(deadline), "the event never reached the worker")
		runtime.Gosched()
	}
	for range 100 {
		runtime.Gosched() // time for a worker that ignored own to run the event
	}
	select {
	case r := <-ran:
		t.Fatalf("the worker handled an event while another goroutine owned its shard (%+v)", r)
	default:
	}
	released.Store(true)
	w.releaseInline()
	require.NoError(t, <-called)
	require.Equal(t, seen{released: true, inline: false}, <-ran)
}

// TestCloseWaitsForAnInlineOwner: Close sends each shard's batch as its
// last owner, so it waits for an inline owner (a receive loop, poller or
// posting goroutine doing the shard's work) to finish before it stops
// the engine.
func TestCloseWaitsForAnInlineOwner(t *testing.T) {
	s := newSide(t, transport.NewMemNetwork(), "10.0.0.1", qp.RC)
	w := s.e.workers[0]
	waiting := make(chan struct{})
	w.testCloseWaits = func() { close(waiting) }
	holdShard(t, w)
	var released atomic.Bool
	closed := make(chan bool)
	go func() {
		s.e.Close()
		closed <- released.Load()
	}()
	<-waiting // Close is at the shard
	for range 100 {
		runtime.Gosched() // time for a Close that did not wait to get on
	}
	select {
	case <-s.e.closed:
		t.Fatal("Close stopped the engine while a goroutine owned a shard")
	default:
	}
	released.Store(true)
	w.releaseInline()
	require.True(t, <-closed, "Close returned after the owner let go")
	select {
	case <-s.e.closed:
	default:
		t.Fatal("Close returned with the engine running")
	}
}
