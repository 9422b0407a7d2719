package roce

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
)

// runBudget is how many packets a QP's requester may send before the
// worker turns to other QPs and events.
const runBudget = 64

// eventQueueLen bounds a worker's inbox.
const eventQueueLen = 1024

type eventKind uint8

const (
	evPacket eventKind = iota
	evKick
	evCall
	evWake // nothing to handle: the worker only runs its run queue
)

// ordered reports whether a packet handled by another owner must not
// overtake an event of kind k (pending counts it): a packet (arrival
// order), or a call (CreateQP, ModifyQP, ... queued before the packet
// came). A kick or a wake only asks the worker to run QPs, which any
// owner may do first: a requester running early reorders nothing the
// peer sees, as a posting goroutine's does.
func (k eventKind) ordered() bool { return k == evPacket || k == evCall }

type event struct {
	kind  eventKind
	qpn   uint32
	pkt   []byte // evPacket: the datagram, in memory lease keeps alive
	lease *transport.Lease
	ep    transport.Endpoint
	fn    func()
	done  chan struct{}
}

// qpEntry is a worker's bookkeeping for one QP (under the worker's own).
type qpEntry struct {
	q       *qp.QP
	ready   bool       // on the run queue
	afterRx bool       // on afterRx: runs when the received batch is handled
	tm      timerState // place in the worker's timer heap (timerheap.go)
}

// worker owns a shard of QPs (those whose number maps to idx) and does
// all of their protocol work. The goroutines that may do it, and when,
// are described in docs/DESIGN.md ("Ownership and locking"); in short,
// whoever holds own is the shard's owner, and only the owner touches a
// QP of the shard (other than qp.QP's PostSend, PostRecv and Close) or
// the fields guarded by own below.
type worker struct {
	// Set by newWorker and never changed; read by any goroutine.
	e        *Engine
	idx      int
	events   chan event // the inbox; sent to by anyone, received by loop
	stop     chan struct{}
	stopOnce sync.Once // closes stop (the receive loop, when it fails)
	txSize   int       // len(txBufs): the Conn's batch size
	// timer fires for the earliest deadline of the shard. Only the owner
	// arms it (rearm); loop receives from its channel without owning.
	timer Timer
	// persist makes a FLUSH's bytes durable (StartPersist); nil is
	// Region.Persist. Tests set it before any QP exists, to gate it.
	persist func(*mr.Region) error
	// testCloseWaits, if set (tests, before Close), is called by
	// closeFlush just before it waits for the shard.
	testCloseWaits func()

	// Ownership of the shard.
	//
	// own is held by whoever runs the shard's protocol work: the worker
	// goroutine while it handles events, or, when the worker is idle, the
	// receive loop, a poller (Engine.Progress) or a posting goroutine that
	// does the work inline to save a goroutine hand-off (latency), and
	// Close while it sends the last batch. It also orders their memory
	// accesses for the race detector.
	own sync.Mutex
	// pending counts ordered events (packets and calls, eventKind.ordered)
	// from enqueue until handle is done with them (atomic; any
	// goroutine). The receive loop and pollers take the shard only when
	// it is zero, before and again after taking own (tryAcquire with
	// needIdle), so a packet they handle inline never overtakes an event
	// queued before it: packets of a QP are processed in arrival order,
	// and after a ModifyQP queued before they arrived. A posting
	// goroutine takes the shard regardless: running a requester early
	// reorders nothing, which is also why kicks and wakes do not count.
	pending atomic.Int64
	// inline is set while a goroutine other than the worker owns the
	// shard (under own).
	inline bool

	// Kicks: QPs whose requester should run, by number, set by posting
	// goroutines (kick) and cleared by the owner. kickMu guards kicked;
	// it is taken with or without own, never the other way round (own is
	// not taken under kickMu). kstate holds two bits (atomic): kOwned,
	// while the shard has an owner that will run every kicked QP before
	// it lets go (settle), so a post that finds the shard busy costs no
	// event and no wake-up of the worker goroutine; and kKicked, set by
	// kick under kickMu after its insertion and cleared under kickMu when
	// kicked is empty (it may stay set with kicked empty: that only
	// sends settle to look). An owner with nothing kicked takes and lets
	// go of kOwned with one atomic operation each instead of kickMu's
	// two: those four locked instructions per shard ownership were 2% of
	// an 8-byte WRITE round trip (docs/performance.md, session R).
	kickMu sync.Mutex
	kicked kickedSet
	kstate atomic.Uint32

	// The owner's state: everything below is guarded by own.

	qps   map[uint32]*qpEntry
	ready []*qpEntry
	// afterRx holds the QPs the packets of the batch being handled were
	// for: each one runs once the whole batch is in (runAfterRx), not
	// after each packet.
	afterRx []*qpEntry
	// spare is the other half of ready's double buffer: runReady swaps
	// them so a round of the run queue does not allocate.
	spare []*qpEntry

	// timerAt is the deadline timer is armed for (zero: stopped);
	// timers holds the shard's QPs that have a deadline; touched the
	// entries to re-key before the next rearm; due is onTimer's scratch.
	timerAt time.Time
	timers  timerHeap
	touched []*qpEntry
	due     []*qpEntry

	// pkt and ri are the receive path's scratch for one packet.
	pkt wire.Packet
	ri  qp.RecvInfo

	// ctr counts for the shard's QPs (qp.Config.Counters): written by the
	// owner only, so no cache line is shared between shards on the
	// per-packet path; read atomically by Engine.Counters, which sums the
	// shards, from any goroutine.
	ctr qp.Counters
	// recvsOwned is ctr.RDMARecvs when the current owner took the shard.
	recvsOwned uint64
	// keptUntil is when a batch that a poller left unsent for its
	// application's answer (release) must leave at the latest: the
	// worker's timer is armed for it (rearm) and flush clears it. Zero:
	// no batch is kept.
	keptUntil time.Time
	// keptPosts says the kept batch holds posts waiting for others to
	// join them (releasePosted), not ACKs kept for an answer.
	keptPosts bool

	// now caches the clock for the owner's current stretch of work:
	// reading it per packet cost a few percent of a bandwidth run. It is
	// dropped whenever ownership is taken and after every system call
	// (flush), so it is never older than one batch of work.
	now    time.Time
	nowSet bool

	// The transmit batch (worker_tx.go).
	txBufs [][]byte // backing buffers, MaxPacketLen each
	txOut  [][]byte // packets of the batch (prefixes of txBufs), without a GatherSender
	// With a GatherSender the batch is txG instead: a packet with
	// its payload in place is headers (txBufs), payload and trailer, and
	// txRegs holds the references to the payloads' memory until the send.
	txG    []transport.Gather
	txRegs []mr.Region
	txN    int
	txEP   transport.Endpoint
	// txResp: the batch holds a response (ACK, READ response);
	// txMixed: a request was added after one.
	txResp  bool
	txMixed bool
	txTmp   txScratch // for requestsFirst
	// wakeAt is the timer's deadline for the idle waker (idlewake.go),
	// which other workers read; only the owner stores it (rearm). Last,
	// away from the fields the round trip touches.
	wakeAt atomic.Int64
}

func newWorker(e *Engine, idx int) *worker {
	bs := e.conn.BatchSize()
	if bs <= 0 {
		bs = transport.DefaultBatchSize
	}
	w := &worker{
		e:      e,
		idx:    idx,
		events: make(chan event, eventQueueLen),
		stop:   make(chan struct{}),
		qps:    make(map[uint32]*qpEntry),
		timer:  e.clock.NewTimer(),
		txBufs: make([][]byte, bs),
		txOut:  make([][]byte, bs),
		txG:    make([]transport.Gather, bs),
		txRegs: make([]mr.Region, bs),
		txSize: bs,
		txTmp: txScratch{bufs: make([][]byte, bs), out: make([][]byte, bs),
			g: make([]transport.Gather, bs), regs: make([]mr.Region, bs)},
	}
	for i := range w.txBufs {
		w.txBufs[i] = make([]byte, qp.MaxPacketLen)
	}
	return w
}

// enqueue hands ev to the worker goroutine; false if the engine stopped.
func (w *worker) enqueue(ev event) bool {
	w.countPending(ev.kind, 1)
	select {
	case w.events <- ev: // the common case, without a three-way select
		return true
	default:
	}
	select {
	case w.events <- ev:
		return true
	case <-w.e.closed:
	case <-w.stop:
	}
	w.countPending(ev.kind, -1)
	return false
}

// offer hands ev to the worker goroutine unless its inbox is full.
func (w *worker) offer(ev event) bool {
	w.countPending(ev.kind, 1)
	select {
	case w.events <- ev:
		return true
	default:
	}
	w.countPending(ev.kind, -1)
	return false
}

// countPending adds d to pending for an event of a kind that is ordered.
func (w *worker) countPending(k eventKind, d int64) {
	if k.ordered() {
		w.pending.Add(d)
	}
}

// forget removes q from the worker and sends what this round
// built so far, q's packets among them: once DestroyQP returns the engine
// sends nothing more for q, so a caller that accounts for a QP's traffic
// (the daemon's send budgets) may stop counting then. Without the flush
// the round's batch left after the call had returned. It reports whether
// q was there (a number reused since is another QP's). Runs on the worker.
func (w *worker) forget(q *qp.QP) bool {
	if w.entryOf(q) == nil {
		return false
	}
	delete(w.qps, q.Num())
	w.flush()
	return true
}

// entryOf returns q's entry in the shard, or nil once DestroyQP forgot q
// (its number may be another QP's since). Runs on the worker.
func (w *worker) entryOf(q *qp.QP) *qpEntry {
	if ent := w.qps[q.Num()]; ent != nil && ent.q == q {
		return ent
	}
	return nil
}

// call runs fn on the worker and waits for it.
func (w *worker) call(fn func()) error {
	done := make(chan struct{})
	if !w.enqueue(event{kind: evCall, fn: fn, done: done}) {
		return ErrClosed
	}
	select {
	case <-done:
		return nil
	case <-w.e.closed:
		return ErrClosed
	case <-w.stop:
		return ErrClosed
	}
}

func (w *worker) loop() {
	defer w.e.wg.Done()
	defer w.timer.Stop()
	more := false // QPs on the run queue want another round
	for {
		if more {
			w.lockOwned()
			w.drain()
		} else {
			select {
			case ev := <-w.events:
				w.lockOwned()
				w.handle(ev)
				// Drain what is already queued before flushing, so packets
				// generated by a burst leave in one batch.
				w.drain()
			case <-w.timer.C():
				w.lockOwned()
				w.timerAt = time.Time{}
				// Responses already queued may make the expiry moot: a
				// retransmit timer must not fire only because this
				// goroutine was slow to get to them.
				w.drain()
				w.onTimer()
			case <-w.e.closed:
				return
			case <-w.stop:
				return
			}
		}
		w.answerWindow()
		w.runReady()
		w.settle()
		w.flush()
		w.rearm()
		more = len(w.ready) > 0
		w.own.Unlock()
		if more {
			select {
			case <-w.e.closed:
				return
			case <-w.stop:
				return
			default:
			}
		}
	}
}

// answerWindow gives an application woken by a receive completion in
// this round the chance to post its answer before the batch (holding our
// ACK) is flushed: its post finds the shard owned and records a kick,
// which settle runs before the flush, so ACK and answer leave in one
// system call instead of the answer waiting behind the ACK's. It costs a
// yield only in rounds that completed a receive.
func (w *worker) answerWindow() {
	if w.txN == 0 || !w.received() {
		return
	}
	runtime.Gosched()
	if w.inline {
		// Not the worker goroutine: it may hold events it dequeued and
		// waits to handle, so taking queued ones would reorder them.
		return
	}
	w.drain()
}

// drain handles up to 256 events that are already queued, and runs the
// QPs their packets were for.
func (w *worker) drain() {
	defer w.runAfterRx()
	for i := 1; i <= 256; i++ {
		select {
		case ev := <-w.events:
			w.handle(ev)
		default:
			return
		}
		if i%flushEvery == 0 {
			// Under a stream, an ACK must not wait for the whole backlog:
			// the peer's window (MaxUnackedPSNs) stalls on it.
			w.runAfterRx()
			w.flush()
		}
	}
}

// flushEvery is how many queued events a worker handles before it sends
// what they produced.
const flushEvery = 16

func (w *worker) handle(ev event) {
	defer w.countPending(ev.kind, -1)
	switch ev.kind {
	case evPacket:
		w.handlePacket(ev.pkt, &ev.ep)
		ev.lease.Release()
	case evKick:
		w.kickMu.Lock()
		w.kicked.remove(ev.qpn)
		w.unmarkKickedIfEmpty()
		w.kickMu.Unlock()
		if ent := w.qps[ev.qpn]; ent != nil {
			w.runQP(ent)
		}
	case evCall:
		ev.fn()
		if ev.done != nil { // nil: nobody waits (persistDone)
			close(ev.done)
		}
	}
}

// runAfterRx runs, once each, the QPs that packets of the batch just
// handled were for. Running a QP after each packet sent what an ACK let
// into the window before the next packet of the same batch was looked
// at: under a stream whose sender is short of CPU, ACKs queue up, and in
// a batch [ACK, ACK, NAK] each ACK sent a message of new PSNs that the
// NAK then threw away (go-back-N: the responder drops everything after
// the gap). TestQPRunsAfterItsWholeBatch.
func (w *worker) runAfterRx() {
	for i, ent := range w.afterRx {
		ent.afterRx = false
		w.afterRx[i] = nil
		if w.qps[ent.q.Num()] == ent {
			w.runQP(ent)
		}
	}
	w.afterRx = w.afterRx[:0]
}

// runQP lets ent's requester send one budget and queues it if it wants
// more.
func (w *worker) runQP(ent *qpEntry) {
	if ent == nil {
		return
	}
	w.touch(ent)
	if ent.q.Run(w, w.clockNow(), runBudget) {
		w.markReady(ent)
	}
}

// markReady puts ent on the run queue once.
func (w *worker) markReady(ent *qpEntry) {
	if !ent.ready {
		ent.ready = true
		w.ready = append(w.ready, ent)
	}
}

// runReady gives every QP on the run queue one more budget.
func (w *worker) runReady() {
	for len(w.ready) > 0 {
		w.nowSet = false
		batch := w.ready
		w.ready, w.spare = w.spare[:0], nil // never two names for one array
		for _, ent := range batch {
			ent.ready = false
			if w.qps[ent.q.Num()] != ent {
				continue
			}
			w.runQP(ent)
		}
		clear(batch) // no stale QP pointers kept alive by the spare buffer
		w.spare = batch[:0]
		// Let incoming ACKs in between rounds.
		if len(w.events) > 0 {
			return
		}
	}
}

// clockNow is the engine clock, read at most once per stretch of work.
func (w *worker) clockNow() time.Time {
	if !w.nowSet {
		w.now, w.nowSet = w.e.clock.Now(), true
	}
	return w.now
}
