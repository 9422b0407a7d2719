// Package roce is the RoCEv2 engine: it moves packets between a
// transport.Conn and the QPs' protocol logic (pkg/qp).
//
// One receive goroutine reads batches from the Conn, rejects runts and
// hands each packet, still in the transport's receive memory (a
// transport.Lease keeps it from reuse; no copy), to the shard of the
// destination QP (QPs are sharded over workers by QPN): it handles a
// short batch's packet itself when the shard is idle, else queues it to
// the shard's worker goroutine. A QP's state is touched only by its
// shard's owner, one goroutine at a time (docs/DESIGN.md, "Ownership
// and locking"), and needs no lock of its own. The owner runs
// the remaining receive checks in rdma_rxe's order (header, QP, type and
// state, address, keys, ICRC), counts every drop by reason, and runs the
// responder or completer. Posted work requests (run by the posting
// goroutine itself when the shard is free) and timer expiries reach the
// same shard; its owner builds packets into the shard's batch buffers and
// sends them with one Conn.Send (or SendGather) per batch. An application that busy-polls
// receives its own packets instead (Engine.Progress, called by ib.CQ.Poll
// when the CQ is empty): no goroutine wakes up on the way.
//
// Wire details that differ from a kernel rdma_rxe and why:
//
//   - UDP source port: rxe sends from 0xC000 | hash(QPNs) for ECMP entropy;
//     the engine sends every packet from its bound port (4791 unless
//     configured otherwise) because it has one unconnected socket per
//     address. rxe accepts any source port, and responds to 4791.
//   - ICRC: packets are sealed for exactly the IP/UDP header Linux puts on
//     an unconnected IP_PMTUDISC_DO socket's datagram (IPv4 ID 0, DF).
//     On receive the IP header is unseen; for IPv4 the sender's ID is
//     solved from the ICRC (wire.Flow.Verify), which leaves 16 of the 32
//     check bits, and the solved ID must then be one the peer can send
//     (ipv4id.go: 0 for an rxed peer, a window around rdma_rxe's counter;
//     rejects count as drop_ipv4_id), which brings a corrupted packet's
//     acceptance from 2^-15 to under 1e-6 (about 4e-10 between rxed
//     engines). Over IPv6 the check is complete.
//   - Receive checks run in rxe_rcv's order (length, destination GID,
//     header, QP, type and state, address, P_Key/Q_Key, ICRC); each drop
//     is counted under its reason (qp.DropReasonNames).
//   - retry_cnt is refilled by any response inside the outstanding window
//     (rxe refills it only on responses that advance the oldest WQE), so
//     a live peer on a lossy path does not fail the QP; a silent peer
//     still exhausts it (RETRY_EXC_ERR).
package roce

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
)

// Config configures an Engine.
type Config struct {
	// Conn carries the packets; required. The engine closes it on Close.
	Conn transport.Conn
	// GIDs is the GID table: the local addresses in order. Empty means the
	// addresses of Conn.LocalAddrs().
	GIDs []netip.Addr
	// Workers is the number of worker goroutines; 0 means GOMAXPROCS
	// (at most 8).
	Workers int
	// Clock drives the retransmit and RNR timers; nil is the system clock.
	Clock Clock
	// IBATimerOnly is qp.Config.IBATimerOnly for every QP of the engine.
	IBATimerOnly bool
	// Logger receives debug and error logs; nil is silent.
	Logger *slog.Logger
	// Mem is the memory table; nil creates one.
	Mem *mr.Table
	// OnEvent receives asynchronous events (QP fatal, communication
	// established, SQ drained); may be
	// nil. It is called by the goroutine that owns the QP's shard (its
	// worker, or one owning it inline: the receive loop, an application
	// in Progress or PostSend; sometimes from inside ModifyQP), so it must not block and must not
	// call the engine's waiting verbs (CreateQP, ModifyQP, QueryQP,
	// DestroyQP): hand the event to another goroutine, as pkg/ib does.
	OnEvent func(Event)
	// Rand seeds the random QP numbers (qpn.go): New reads 32 bytes from
	// it. nil is crypto/rand; tests inject a seeded source (e.g.
	// math/rand/v2's ChaCha8) for reproducible numbers.
	Rand io.Reader
	// BusyPoll, when positive, keeps the receive goroutine polling the
	// socket after each batch until the device has been silent that long,
	// before it blocks in a receive again, like Linux's SO_BUSY_POLL
	// (busypoll.go). It spends a CPU to save a thread wake-up per gap in
	// the traffic; for a process whose application idles while the engine
	// serves (rxed perf's WRITE and READ servers). 0: block at once. Only
	// a Conn that can be polled (transport.Poller) busy-polls.
	BusyPoll time.Duration
	// DoorbellBatch, when positive, lets posts of several goroutines
	// leave in one send while at least doorbellSpinners goroutines spin
	// on the engine's completions: a post waits in its shard's batch for
	// up to DoorbellBatch (doorbell.go). 0: every post is sent at once.
	DoorbellBatch time.Duration
}

// EventType is the kind of an asynchronous event.
type EventType int

// Asynchronous events (subset of enum ibv_event_type).
const (
	EventQPFatal   EventType = 1 // IBV_EVENT_QP_FATAL
	EventCommEst   EventType = 3 // IBV_EVENT_COMM_EST: a connected QP took its first request (qp.Config.OnCommEst)
	EventSQDrained EventType = 5 // IBV_EVENT_SQ_DRAINED
)

// Event is an asynchronous event.
type Event struct {
	Type EventType
	QPN  uint32
}

// Engine is one RoCE device's data path.
type Engine struct {
	conn         transport.Conn
	gids         []netip.Addr
	gidPorts     []uint16 // the port of gids[i]'s socket: route's lookup, without hashing an address
	ports        map[netip.Addr]uint16
	clock        Clock
	wake         *idleWaker // processWaker with the SystemClock, else nil (idlewake.go)
	ibaTimerOnly bool       // Config.IBATimerOnly
	// polledAt is when Progress was last called (nanotime): an engine
	// whose own application polls it needs no other spinner's help
	// (ProgressOthers).
	polledAt atomic.Int64
	// sleepers counts the application goroutines asleep until one of
	// the engine's completions (BeginSleep, EndSleep).
	sleepers atomic.Int32
	// keptBatches counts the shards whose batch a poller kept for its
	// application's answer (worker.keep): an empty poll sends them.
	keptBatches atomic.Int32
	// spinners counts the goroutines spinning on the engine's
	// completions now (SpinWhileBusy), for the doorbell batch.
	spinners atomic.Int32
	// streamingAt is when the engine last received a batch longer than
	// inlineBatch (nanotime; 0: never): a stream, which its receive
	// goroutine carries and other engines' pollers leave to it
	// (forOthersToHelp).
	streamingAt atomic.Int64
	// rxBatches counts the receive batches dispatched (ReceivedBatches).
	rxBatches atomic.Uint64
	log       *slog.Logger
	mem       *mr.Table
	onEvent   func(Event)

	drops [qp.NumDropReasons]atomic.Uint64

	// ids checks the IPv4 Identification solved from each ICRC
	// (ipv4id.go); idResyncs counts the windows re-anchored.
	ids       idGuard
	idResyncs atomic.Uint64
	// mcastNoMember counts datagrams for a multicast group with no QP
	// attached here (mcast.go): not a drop, as in rdma_rxe.
	mcastNoMember atomic.Uint64
	// mcastSkipped counts an attached QP's refusals of a multicast
	// datagram for its type or state (mcast.go): not a drop, as in rdma_rxe.
	mcastSkipped atomic.Uint64
	// doorbellBatches counts the batches of posts kept for others to
	// join (CounterDoorbellBatches).
	doorbellBatches atomic.Uint64

	workers []*worker
	qpns    *qpnAllocator
	mcast   mcastTable // multicast groups and their QPs (mcast.go)

	lender    transport.Lender
	poller    transport.Poller       // nil unless the Conn can be polled
	rxMu      sync.Mutex             // whoever receives and dispatches: receive loop or a poller
	rx        *rxBatch               // under rxMu
	gs        transport.GatherSender // nil: the Conn sends whole datagrams only
	inlineAll bool                   // see inlineProcs
	busyPoll  time.Duration          // Config.BusyPoll (0 without a poller)
	doorbell  time.Duration          // Config.DoorbellBatch

	closeOnce sync.Once
	closing   atomic.Bool // Close began: pollers take nothing more (tryPoll, under rxMu)
	closed    chan struct{}
	wg        sync.WaitGroup
	persists  sync.WaitGroup // FLUSH msyncs in flight (worker.StartPersist)
}

// CounterIPv4IDResync counts the IPv4 Identification windows re-anchored
// (two consecutive packets from a peer agreed on IDs outside its window;
// see drop_ipv4_id).
const CounterIPv4IDResync = "ipv4_id_resync"

// CounterMcastNoMember counts multicast datagrams for a group no QP of the
// device is attached to (it left, or never joined): ignored, not dropped.
const CounterMcastNoMember = "mcast_no_member"

// CounterMcastSkipped counts the attached QPs that skipped a multicast
// datagram for their type or state (rxe_rcv_mcast_pkt's check_type_state:
// the datagram is in rcvd_pkts already, and rxe counts the skip nowhere).
const CounterMcastSkipped = "mcast_skipped"

// CounterDoorbellBatches counts the batches of posts kept for other
// posts to join them (Config.DoorbellBatch): 0 when the option is off or
// fewer than four goroutines ever spun at once.
const CounterDoorbellBatches = "doorbell_batches"

// ErrClosed is returned by operations on a closed engine.
var ErrClosed = errors.New("roce: engine closed")

// New starts an engine on cfg.Conn.
func New(cfg Config) (*Engine, error) {
	if cfg.Conn == nil {
		return nil, errors.New("roce: Config.Conn is required")
	}
	e := &Engine{
		conn:         cfg.Conn,
		clock:        cfg.Clock,
		ibaTimerOnly: cfg.IBATimerOnly,
		log:          cfg.Logger,
		mem:          cfg.Mem,
		onEvent:      cfg.OnEvent,
		ports:        make(map[netip.Addr]uint16),
		closed:       make(chan struct{}),
	}
	if e.clock == nil {
		e.clock = SystemClock{}
	}
	if _, ok := e.clock.(SystemClock); ok {
		e.wake = systemWaker()
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if e.mem == nil {
		e.mem = mr.NewTable(nil)
	}
	// GIDs carry no zone (a GID is 16 bytes), nor does any address the
	// engine compares: a Conn bound to a link-local address lists it with
	// its zone (fe80::1%eth0) but reports the addresses of the datagrams
	// it receives without one, and sends on its interface itself.
	for _, ap := range cfg.Conn.LocalAddrs() {
		e.ports[transport.GIDAddr(ap.Addr())] = ap.Port()
	}
	if len(cfg.GIDs) > 0 {
		for _, g := range cfg.GIDs {
			e.gids = append(e.gids, transport.GIDAddr(g))
		}
	} else {
		for _, ap := range cfg.Conn.LocalAddrs() {
			e.gids = append(e.gids, transport.GIDAddr(ap.Addr()))
		}
	}
	if len(e.gids) == 0 {
		return nil, errors.New("roce: no local address")
	}
	// A GID without a socket of its own is served by a wildcard-bound one
	// (0.0.0.0 or ::) of its family: its packets leave from that socket's
	// port, which the ICRC covers, so the GID has that port.
	for _, g := range e.gids {
		if _, ok := e.ports[g]; ok {
			continue
		}
		wild := netip.IPv6Unspecified()
		if g.Is4() {
			wild = netip.IPv4Unspecified()
		}
		if p, ok := e.ports[wild]; ok {
			e.ports[g] = p
		}
	}
	for _, g := range e.gids {
		e.gidPorts = append(e.gidPorts, e.ports[g])
	}
	n := cfg.Workers
	if n <= 0 {
		n = min(runtime.GOMAXPROCS(0), 8)
	}
	qpns, err := newQPNAllocator(cfg.Rand)
	if err != nil {
		return nil, err
	}
	e.qpns = qpns
	e.lender = transport.Lend(cfg.Conn)
	if p, ok := cfg.Conn.(transport.Poller); ok && p.CanPoll() {
		e.poller = p
	}
	e.gs, _ = cfg.Conn.(transport.GatherSender)
	e.inlineAll = runtime.GOMAXPROCS(0) <= inlineProcs
	if e.poller != nil {
		e.busyPoll = max(cfg.BusyPoll, 0)
	}
	e.doorbell = max(cfg.DoorbellBatch, 0)
	for i := 0; i < n; i++ {
		w := newWorker(e, i)
		e.workers = append(e.workers, w)
		e.wake.register(&w.wakeAt)
	}
	e.rx = e.newRxBatch()
	for _, w := range e.workers {
		e.wg.Add(1)
		go w.loop()
	}
	e.wg.Add(1)
	go e.receiveLoop()
	if e.poller != nil {
		// Last: other goroutines' ProgressOthers may call progress from
		// here on, which needs everything above.
		pollables.add(e)
	}
	return e, nil
}

// Close stops the engine and closes its Conn. QPs stop; what the shards
// had batched is sent first (closeFlush: the ACK of the application's
// last receive), nothing after.
func (e *Engine) Close() error {
	var err error
	e.closeOnce.Do(func() {
		// Wait out a poller (this engine's application, another engine's
		// spinner, a receive loop helping) that is dispatching a batch it
		// took: it holds rxMu until its batch is handled, and from here
		// on tryPoll takes nothing. Without this Close returned while such
		// a poller still handled packets (a completion after Close, its
		// ACK kept and never sent).
		e.closing.Store(true)
		e.rxMu.Lock()
		e.rxMu.Unlock()
		// Send what is batched first: an application that saw its last
		// receive completion and closes must not take the ACK for that
		// message with it, or the peer retries into the void.
		for _, w := range e.workers {
			w.closeFlush()
		}
		close(e.closed)
		if e.poller != nil {
			pollables.remove(e)
		}
		err = e.conn.Close()
		// The multicast groups' receive loops are not in wg: a join may
		// start one at any time, and leaveAll orders joins against Close
		// under the table's lock instead.
		e.mcast.leaveAll(e)
		e.wg.Wait()
		// The other engines of the process poll this one's socket
		// (ProgressOthers): one may have been in a receive on it when
		// Close ran, and the socket closes when that ends. Wait for it,
		// so that the address can be bound again once Close returns (a
		// device reopened on it failed with "address already in use"
		// about once in 200 in cmd/rxed's tests). Only system calls are
		// waited for: this engine's goroutines are gone.
		if cw, ok := e.conn.(transport.CloseWaiter); ok {
			cw.WaitClosed()
		}
		for _, w := range e.workers {
			e.wake.unregister(&w.wakeAt)
		}
		// A FLUSH's msync holds its region until it returns: wait, so that
		// the memory can be closed once the engine is.
		e.persists.Wait()
	})
	return err
}

// Memory returns the engine's memory table.
func (e *Engine) Memory() *mr.Table { return e.mem }

// GIDs returns the GID table (local addresses, IPv4 unmapped, without
// zones).
func (e *Engine) GIDs() []netip.Addr { return append([]netip.Addr(nil), e.gids...) }

// Port returns the UDP port the engine receives on at addr (its zone, if
// any, ignored).
func (e *Engine) Port(addr netip.Addr) uint16 { return e.ports[transport.GIDAddr(addr)] }

// Clock returns the engine's clock.
func (e *Engine) Clock() Clock { return e.clock }

func (e *Engine) gid(i uint8) netip.Addr {
	if int(i) < len(e.gids) {
		return e.gids[i]
	}
	return netip.Addr{}
}

// gidEndpoint returns GID i with the port of its socket (invalid for an
// index past the table).
func (e *Engine) gidEndpoint(i uint8) netip.AddrPort {
	if int(i) < len(e.gids) {
		return netip.AddrPortFrom(e.gids[i], e.gidPorts[i])
	}
	return netip.AddrPort{}
}

// hasSocket reports whether ap is the address of one of the engine's
// sockets (as a datagram it sent carries it for its source).
func (e *Engine) hasSocket(ap netip.AddrPort) bool {
	return ap.Port() != 0 && e.Port(ap.Addr()) == ap.Port()
}

// isLocal reports whether a is in the GID table (an invalid a, from a
// transport that does not report destinations, is accepted).
func (e *Engine) isLocal(a netip.Addr) bool {
	if !a.IsValid() {
		return true
	}
	a = a.Unmap()
	for _, g := range e.gids {
		if g == a {
			return true
		}
	}
	return false
}

func (e *Engine) workerFor(qpn uint32) *worker {
	return e.workers[int(qpn)%len(e.workers)]
}

// CreateQP creates a QP in RESET; c.Mem, c.GIDs and c.Counters are
// filled in by the engine. c.Num 0 draws a random QP number (qpn.go); a
// non-zero c.Num asks for that number (a test that replays captured
// packets), ErrQPNInUse if it exists. The GSI QP (c.Type qp.GSI) is
// always QP1, at most one per engine; no other type may be QP1, and QP0
// never exists (packets for it are dropped as drop_qp, as rxe does).
func (e *Engine) CreateQP(c qp.Config) (*qp.QP, error) {
	select {
	case <-e.closed:
		return nil, ErrClosed
	default:
	}
	c.Mem = e.mem
	c.GIDs = e.gids
	c.IBATimerOnly = c.IBATimerOnly || e.ibaTimerOnly
	num, err := e.qpns.numFor(&c)
	if err != nil {
		return nil, err
	}
	c.Num = num
	c.Counters = &e.workerFor(num).ctr
	c.OnError = e.alsoRaise(c.OnError, EventQPFatal)
	c.OnSQDrained = e.alsoRaise(c.OnSQDrained, EventSQDrained)
	c.OnCommEst = e.alsoRaise(c.OnCommEst, EventCommEst)
	q, err := qp.New(c)
	if err != nil {
		e.qpns.release(num, false)
		return nil, err
	}
	q.SetLocalOps(localOps{e})
	q.SetRemoteInvalidate(e.remoteInvalidate)
	w := e.workerFor(num)
	if err := w.call(func() { w.qps[num] = &qpEntry{q: q} }); err != nil {
		e.qpns.release(num, false)
		return nil, err
	}
	e.datagramTraffic(c.Type, true)
	return q, nil
}

// ModifyQP applies attributes to q on its worker (ibv_modify_qp).
func (e *Engine) ModifyQP(q *qp.QP, a *qp.Attr, mask qp.AttrMask) error {
	w := e.workerFor(q.Num())
	var err error
	if cerr := w.call(func() {
		ent := w.entryOf(q)
		if ent == nil {
			err = qp.ErrDestroyed // DestroyQP ran first: q is nobody's now
			return
		}
		err = q.Modify(a, mask, e.clock.Now())
		if err == nil {
			w.runQP(ent)
		}
	}); cerr != nil {
		return cerr
	}
	return err
}

// QueryQP returns q's attributes (ibv_query_qp).
func (e *Engine) QueryQP(q *qp.QP) (qp.Attr, error) {
	w := e.workerFor(q.Num())
	var a qp.Attr
	err := qp.ErrDestroyed
	if cerr := w.call(func() {
		if w.entryOf(q) != nil {
			a, err = q.Attr(), nil
		}
	}); cerr != nil {
		return qp.Attr{}, cerr // the call may still run: a is not ours to read
	}
	return a, err
}

// DestroyQP removes q; packets for it are then dropped as drop_qp, and
// once it returns the engine sends nothing more for q (what q had built
// leaves first). Its number is held back from allocation for the next
// RecentQPNs destroys. It closes q first (qp.QP.Close), so later posts
// and multicast attaches are refused with qp.ErrDestroyed.
func (e *Engine) DestroyQP(q *qp.QP) error {
	num := q.Num()
	// Before the detach below: an AttachMcast that takes the group table
	// after the detach sees q closed (mcast.go).
	q.Close()
	w := e.workerFor(num)
	removed := false
	err := w.call(func() { removed = w.forget(q) })
	// On ErrClosed the call may still run later on the worker: removed is
	// only ours to read when it returned nil (and a closed engine hands
	// out no more numbers).
	if err == nil && removed {
		e.mcast.detachAll(e, q) // rxe_drop_all_mcast_groups (mcast.go)
		// Type 2 windows name their QP by number: those bound through q
		// must not be reachable from the next QP to get num (rxe's
		// windows hold the QP object itself).
		e.mem.DetachQP(num)
		e.qpns.release(num, true)
		e.datagramTraffic(q.Type(), false)
	}
	return err
}

// PostSend queues send WRs on q and wakes its worker. On error the WRs
// before index n were posted.
func (e *Engine) PostSend(q *qp.QP, wrs []qp.SendWR) (n int, err error) {
	for n = range wrs {
		if err = q.PostSend(&wrs[n]); err != nil {
			break
		}
	}
	if err == nil {
		n = len(wrs)
	}
	if n > 0 {
		e.kick(q)
	}
	return n, err
}

// PostRecv queues receive WRs on q's own receive queue.
func (e *Engine) PostRecv(q *qp.QP, wrs []qp.RecvWR) (n int, err error) {
	for n = range wrs {
		if err = q.PostRecv(&wrs[n]); err != nil {
			break
		}
	}
	if err == nil {
		n = len(wrs)
	}
	if n > 0 && q.State() == qp.Err {
		e.kick(q) // flush them, as a QP in ERR does
	}
	return n, err
}

// kick runs q's requester after a post (PostSend, PostRecv on a QP in
// ERR): right here when the shard is free, else by its owner or worker
// (worker.kick).
func (e *Engine) kick(q *qp.QP) {
	w := e.workerFor(q.Num())
	num := q.Num()
	// An idle worker's work is done by the posting goroutine itself, as
	// ibv_post_send does in a provider library; a busy one is asked to.
	if w.tryAcquire(false) {
		w.runQP(w.qps[num])
		if e.batchDoorbells() {
			w.releasePosted()
		} else {
			w.releaseInline()
		}
		return
	}
	w.kick(num)
}

// Counters returns every counter by name: rxe's protocol counters and one
// per drop reason.
func (e *Engine) Counters() map[string]uint64 {
	m := e.workers[0].ctr.Snapshot()
	for _, w := range e.workers[1:] {
		for k, v := range w.ctr.Snapshot() {
			m[k] += v
		}
	}
	for i := 1; i < qp.NumDropReasons; i++ {
		m[qp.DropReason(i).String()] = e.Drops(qp.DropReason(i))
	}
	if sr, ok := e.conn.(transport.StatsReporter); ok {
		// A fault injector's delayed datagrams are sent by its timer, not
		// by a worker's Send: their refusals reach send_err only here.
		m["send_err"] += sr.Stats().SendRefusedLate
	}
	m[CounterIPv4IDResync] = e.idResyncs.Load()
	m[CounterMcastNoMember] = e.mcastNoMember.Load()
	m[CounterMcastSkipped] = e.mcastSkipped.Load()
	m[CounterDoorbellBatches] = e.doorbellBatches.Load()
	return m
}

// Drops returns the drop counter for one reason. Overruns happen before
// the engine sees a packet: the receive loop waits for a worker with a
// full inbox rather than drop, so the kernel's socket buffer (or an
// in-memory queue) overflows instead, and the Conn counts that.
func (e *Engine) Drops(r qp.DropReason) uint64 {
	n := e.drops[r].Load()
	if r == qp.DropOverrun {
		if sr, ok := e.conn.(transport.StatsReporter); ok {
			st := sr.Stats()
			n += st.DropRcvbuf + st.DropQueueFull
		}
	}
	return n
}

func (e *Engine) drop(r qp.DropReason) { e.drops[r].Add(1) }

// remoteInvalidate invalidates the rkey named by a SEND_WITH_INV.
func (e *Engine) remoteInvalidate(q *qp.QP, rkey uint32) qp.WCStatus {
	if err := e.mem.Invalidate(q.PD(), q.Num(), rkey); err != nil {
		return qp.WCStatus(mr.RemoteInvalidateStatus(err))
	}
	return qp.WCSuccess
}

// rxBatch is the receive side's scratch: the datagrams of one batch, lent
// by the Conn, and the shards taken to handle them inline. It is used
// under Engine.rxMu (by the receive loop or by a poller).
type rxBatch struct {
	pkts   [][]byte
	eps    []transport.Endpoint
	leases []*transport.Lease
	held   []bool // shards owned for the batch
}

func (e *Engine) newRxBatch() *rxBatch {
	bs := e.conn.BatchSize()
	if bs <= 0 {
		bs = transport.DefaultBatchSize
	}
	return &rxBatch{
		pkts:   make([][]byte, bs),
		eps:    make([]transport.Endpoint, bs),
		leases: make([]*transport.Lease, bs),
		held:   make([]bool, len(e.workers)),
	}
}

// receiveLoop waits for batches and dispatches packets by destination QPN.
func (e *Engine) receiveLoop() {
	defer e.wg.Done()
	rx := e.rx
	for {
		var n int
		var err error
		if e.poller != nil {
			// Returns holding rxMu: pollers (Progress) take no newer
			// packets before these are dispatched.
			n, err = e.poller.ReceiveLentLocked(rx.pkts, rx.eps, rx.leases, &e.rxMu)
		} else {
			n, err = e.lender.ReceiveLent(rx.pkts, rx.eps, rx.leases)
			if err == nil {
				e.rxMu.Lock()
			}
		}
		if err != nil {
			select {
			case <-e.closed:
			default:
				e.log.Error("roce: receive failed; engine stopping", "err", err)
			}
			for _, w := range e.workers {
				w.stopOnce.Do(func() { close(w.stop) })
			}
			return
		}
		from := rx.eps[0].Remote // who sent the batch: our answer went there
		anyHeld, ok := e.dispatch(n, false)
		e.rxMu.Unlock()
		if !ok {
			return
		}
		if anyHeld && n <= inlineBatch {
			// Let a goroutine this batch woke (an application waiting
			// for the completion) run before this loop's next receive
			// call, which on an idle socket is a system call that finds
			// nothing: the answer then leaves a system call earlier.
			runtime.Gosched()
			e.helpSleepingPeers(from)
		}
		if e.busyPoll > 0 {
			e.pollWhileBusy()
		}
	}
}

// Progress receives what the Conn has queued now and handles it in the
// calling goroutine, without waiting; it returns the number of packets
// taken. An application that spins on a completion queue (ib.CQ.Poll
// calls it when the queue is empty) thus receives its own packets: no
// wake-up of the receive goroutine and no hand-off back, which is most of
// a round trip on loopback. It returns 0 at once when the Conn cannot be
// polled (see transport.Poller; in-memory Conns and Conns of several
// sockets cannot), or when another goroutine is receiving. Like the
// engine's waiting verbs it must not be called from OnEvent or a
// qp.CQ notify handler (they run on a worker, which Progress may wait for).
//
// A Progress call says that its caller spins: for a moment the receive
// goroutine stops waiting on the socket (transport.Poller.Cover), so
// that what arrives wakes no thread and the next Progress takes it. A
// spinner that goes to sleep calls StopPolling (CQ.WaitPoll does); one
// that just stops calling delays the next datagram by at most the
// cover's span (200 us on Linux).
func (e *Engine) Progress() int {
	if e.poller == nil {
		return 0
	}
	if len(pollables.load()) > 1 {
		// Only ProgressOthers reads it, and only with another engine
		// in the process: a lone engine's spinner reads no clock.
		e.polledAt.Store(nanotime())
	}
	return e.progressCovering()
}

// progressCovering is progress for a spinner: a poll that found nothing
// or a short batch covers the socket (the spinner keeps up and will take
// the next datagram itself), a poll that found more ends the cover (the
// spinner is behind: the receive goroutine, on another CPU, had better
// help, as it does for a stream of 64 KiB WRITEs).
//
// A short batch covers too because a spinner whose every poll takes
// something never makes an empty one: one that handles another engine's
// request before its own poll (ProgressWithOthers) finds the answer
// there each time. Covered only by empty polls, its socket's cover
// lapsed and every answer woke the receive goroutine's thread: 0.10
// context switches per 8-byte WRITE round trip instead of 0.05
// (docs/performance.md, session N).
//
// A poll that could not look, because another goroutine was receiving
// (the receive goroutine, carrying a stream), leaves the cover as it
// was: covering then sent that goroutine to sleep at its next wait while
// the stream still flowed (a 64 KiB WRITE stream on 1 QP in event mode,
// whose waits poll the in-process peer first: 3.46 GB/s with that cover,
// 3.77 without, medians of 6 runs, session O).
func (e *Engine) progressCovering() int {
	n, busy := e.tryPoll(true)
	if busy {
		return 0
	}
	if keepsUp(n) {
		e.poller.Cover()
	} else {
		e.poller.Uncover()
	}
	return n
}

// keepsUp reports whether a spinner whose poll took n packets keeps up
// with its socket (progressCovering).
func keepsUp(n int) bool { return n <= inlineBatch }

// ProgressBeforeSleep is Progress for a goroutine about to sleep until a
// completion (CQ.WaitPoll). It returns the packets it handled; when that
// is more than 0 the caller looks at its CQ again instead of sleeping.
//
// It takes what is queued as a spinner does (ProgressWithOthers): the
// other engines of the process first, then e, each poll covering its
// socket. Others first because an in-process peer's answer to what the
// caller just posted comes from the peer's socket, and handling it there
// sends the answer into e's socket during that very send: the whole
// round trip runs in the caller's goroutine, as a TCP ping-pong does in
// Go's netpoller, and no thread wakes. Covering because the sockets'
// receive goroutines otherwise wake at each arrival only to find them
// empty. Measured (in-process 8-byte WRITE round trip in event mode,
// 100,000, docs/performance.md session O): 7.3 -> 4.6 us at the median,
// a p99 of 34 -> 6 us and 0.04 -> 0.015 context switches per round trip;
// handling only e's socket, it found nothing, slept, and the receive
// goroutines carried the round trip. Engines that stream are left to
// their receive goroutines, as by a spinner (forOthersToHelp), and
// engines with an application asleep on their completions are left out
// too (forOthersUnattended): handling
// their packets wakes that application from here, and the ACK of its
// request leaves alone instead of with its answer (an 8-byte SEND
// ping-pong, both ends sleeping: 9.1 -> 12.9-14.2 us with them).
//
// Only when nothing came does the caller go to sleep: it ends the cover
// (StopPolling), so the receive goroutines watch their sockets again,
// and polls once more for what came in between. A caller that found
// work and returns leaves the sockets covered, as a spinner's poll does:
// if it does not come back, a datagram waits at most the cover's 200 us
// for the receive goroutine. With no other engine to help (a process
// with one device, or peers that are attended) there is no covering
// pass: the end of the cover and one poll, as before, without an empty
// poll more per sleep (0.2 us of the SEND ping-pong's).
func (e *Engine) ProgressBeforeSleep() int {
	if e.poller == nil {
		return 0
	}
	n, others := 0, false
	now := clockForOthers()
	forOthersUnattended(e, now, func(o *Engine) { n, others = n+o.progressCovering(), true })
	if others {
		if n += e.progressCovering(); n > 0 {
			return n
		}
	}
	e.stopPolling(now)
	forOthersUnattended(e, now, func(o *Engine) { n += o.progress() })
	return n + e.progress()
}

// BeginSleep says that an application goroutine goes to sleep until one
// of e's completions (CQ.WaitPoll), EndSleep that it woke.
func (e *Engine) BeginSleep() { e.sleepers.Add(1) }

// EndSleep ends a BeginSleep.
func (e *Engine) EndSleep() { e.sleepers.Add(-1) }

// Sleepers is how many application goroutines are asleep on e's
// completions now (BeginSleep without its EndSleep).
func (e *Engine) Sleepers() int { return int(e.sleepers.Load()) }

// progress is Progress without marking the engine as polled by its own
// application (ProgressOthers).
func (e *Engine) progress() int { return e.pollOnce(true) }

// pollOnce takes what the Conn has queued now, if no other goroutine is
// receiving, and dispatches it; polled says the caller is a poller (an
// application), not the receive loop (see dispatch).
func (e *Engine) pollOnce(polled bool) int {
	n, _ := e.tryPoll(polled)
	return n
}

// tryPoll is pollOnce that also reports busy when another goroutine was
// receiving (it polled nothing then).
func (e *Engine) tryPoll(polled bool) (n int, busy bool) {
	if !e.rxMu.TryLock() {
		return 0, true
	}
	defer e.rxMu.Unlock()
	if e.closing.Load() {
		return 0, false
	}
	rx := e.rx
	n, err := e.poller.PollLent(rx.pkts, rx.eps, rx.leases)
	if n == 0 || err != nil {
		if polled && e.keptBatches.Load() > 0 {
			e.sendKept()
		}
		return 0, false // errors are the receive loop's to report
	}
	e.dispatch(n, polled)
	return n, false
}

// dispatch hands the n packets in e.rx to their workers, or handles them
// right here for idle workers. Called under rxMu. It reports whether it
// handled any inline, and false in ok when the engine stopped.
//
// A short batch (the latency path: a request, or an ACK and an answer)
// is handled inline for every idle worker, one goroutine hand-off less
// per packet; each held shard is flushed once at the end, so what the
// batch provokes leaves together. Anything else queues behind what its
// worker already has, preserving arrival order (a worker with queued
// events is never taken over). Long batches go to the workers, which then
// work in parallel with this loop's next system call. A poller (polled)
// handles everything it can inline: it spins on a CPU of its own and
// gains nothing by waking a worker.
func (e *Engine) dispatch(n int, polled bool) (anyHeld, ok bool) {
	rx := e.rx
	e.rxBatches.Add(1)
	if n > inlineBatch {
		e.streamingAt.Store(nanotime())
	}
	inline := n <= inlineBatch || e.inlineAll || polled
	// A poller keeps a batch holding ACKs for its application's answer
	// only after a short receive batch (a message, or a message and an
	// ACK: the latency pattern, worker.release); after a longer one,
	// a stream whose sender waits for those ACKs, it sends them at once.
	keep := polled && keepsUp(n)
	for i := 0; i < n; i++ {
		pkt, lease := rx.pkts[i], rx.leases[i]
		rx.pkts[i], rx.leases[i] = nil, nil // the worker owns them now
		if len(pkt) < wire.BTHLen+wire.ICRCLen {
			e.drop(qp.DropLength)
			lease.Release()
			continue
		}
		w := e.workerFor(wire.BTH(pkt[:wire.BTHLen]).DestQP())
		if inline && (rx.held[w.idx] || w.tryAcquire(true)) {
			rx.held[w.idx], anyHeld = true, true
			w.handlePacket(pkt, &rx.eps[i])
			lease.Release()
			continue
		}
		// A worker with a full inbox makes this loop wait: the kernel
		// socket buffer (DefaultSocketBufferBytes) absorbs the backlog,
		// much larger than an inbox. Dropping here instead would lose UC
		// messages on an uncongested loopback whenever a worker falls
		// behind for a moment.
		if !w.enqueue(event{kind: evPacket, pkt: pkt, ep: rx.eps[i], lease: lease}) {
			lease.Release()
			for j := i + 1; j < n; j++ {
				rx.leases[j].Release()
				rx.pkts[j], rx.leases[j] = nil, nil
			}
			e.releaseHeld(polled, keep)
			return anyHeld, false
		}
	}
	if anyHeld {
		e.releaseHeld(polled, keep)
	}
	return anyHeld, true
}

// sendKept sends the batches pollers kept for their applications' answers
// (worker.release). A poll that finds nothing new means the application
// polled again rather than answer, and a sender whose window waits for
// the ACKs in such a batch (a stream of SENDs to a polling receiver that
// has caught up with it) must not wait keepSpan for them: they leave
// within one poll, about as soon as the worker woken for each kept batch
// used to send them. A shard whose owner is busy is skipped: that owner
// sends a kept batch when it lets go.
func (e *Engine) sendKept() {
	for _, w := range e.workers {
		w.tryInline(false, func() {})
	}
}

// inlineBatch is the longest receive batch the receive loop handles
// itself for idle workers, unless inlineAll.
const inlineBatch = 4

// inlineProcs is the GOMAXPROCS up to which the receive loop handles
// every batch itself for idle workers: on two CPUs, shared by the
// application, this loop and the workers (and on loopback the peer), the
// hand-off to a worker buys no parallelism and costs a channel operation
// and a wake-up per packet (measured: ~15% less CPU per byte of a 64 KiB
// WRITE stream handled inline).
const inlineProcs = 2

// releaseHeld lets go of the shards taken for a batch. A poller is
// (typically) the application the batch's receive completions are for,
// and it answers after Poll returns, not in an answer window: with keep, a
// batch holding ACKs for messages it received is left unsent for that
// answer to join, and whoever owns the shard next sends it (the
// application's post, the next poll, or the worker goroutine when its
// timer finds it still kept keepSpan later: worker.release).
func (e *Engine) releaseHeld(polled, keep bool) {
	for i, h := range e.rx.held {
		if h {
			e.rx.held[i] = false
			e.workers[i].release(polled, keep)
		}
	}
}

// ReceivedBatches counts the batches of datagrams the engine has received
// so far, by any goroutine: a waiter that sees it move knows the device is
// busy receiving (ib.HybridWaiter keeps spinning while it does).
func (e *Engine) ReceivedBatches() uint64 { return e.rxBatches.Load() }

// String describes the engine for logs.
func (e *Engine) String() string {
	return fmt.Sprintf("roce.Engine{gids=%v workers=%d}", e.gids, len(e.workers))
}

// alsoRaise is a QP hook that calls user's (if any), then raises the
// engine event typ for the QP (Config.OnEvent).
func (e *Engine) alsoRaise(user func(*qp.QP), typ EventType) func(*qp.QP) {
	return func(q *qp.QP) {
		if user != nil {
			user(q)
		}
		if e.onEvent != nil {
			e.onEvent(Event{Type: typ, QPN: q.Num()})
		}
	}
}
