package roce

import (
	"errors"
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

type event struct {
	kind  eventKind
	qpn   uint32
	pkt   []byte // evPacket: the datagram, in memory lease keeps alive
	lease *transport.Lease
	ep    transport.Endpoint
	fn    func()
	done  chan struct{}
}

// qpEntry is a worker's bookkeeping for one QP.
type qpEntry struct {
	q       *qp.QP
	ready   bool // on the run queue
	kicked  atomic.Bool
	destroy bool
	tm      timerState // place in the worker's timer heap (timerheap.go)
}

// worker owns a shard of QPs and does all of their protocol work.
type worker struct {
	e      *Engine
	idx    int
	events chan event
	stop   chan struct{}

	stopOnce sync.Once

	// own is held by whoever runs the shard's protocol work: the worker
	// goroutine while it handles events, or, when the worker is idle, the
	// receive loop or a posting goroutine that does the work inline to
	// save a goroutine hand-off (latency). It also orders their memory
	// accesses for the race detector.
	own sync.Mutex
	// pending counts events enqueued and not yet handled. The receive
	// loop only handles a packet inline when it is zero, so packets of a
	// QP are never processed out of arrival order.
	pending atomic.Int64
	// inline is set while a goroutine other than the worker owns the
	// shard (under own).
	inline bool

	qps   map[uint32]*qpEntry
	ready []*qpEntry
	// spare is the other half of ready's double buffer: runReady swaps
	// them so a round of the run queue does not allocate.
	spare []*qpEntry

	timer   Timer
	timerAt time.Time
	// timers holds the shard's QPs that have a deadline; touched the
	// entries to re-key before the next rearm; due is onTimer's scratch.
	timers  timerHeap
	touched []*qpEntry
	due     []*qpEntry

	// kicks for QPs by number, set from PostSend; the owner clears them.
	// While owned is set (under kickMu) the shard's current owner runs
	// every kicked QP before it lets go (settle), so a post that finds the
	// shard busy costs no event and no wake-up of the worker goroutine.
	kickMu  sync.Mutex
	kickSet map[uint32]bool
	owned   bool

	pkt wire.Packet
	ri  qp.RecvInfo

	// persist makes a FLUSH's bytes durable (StartPersist); nil is
	// Region.Persist. Tests set it before any QP exists, to gate it.
	persist func(*mr.Region) error

	// ctr counts for the shard's QPs (qp.Config.Counters): one writer at a
	// time, so no cache line is shared between shards on the per-packet
	// path; Engine.Counters sums the shards.
	ctr qp.Counters
	// recvsOwned is ctr.RDMARecvs when the current owner took the shard.
	recvsOwned uint64

	// now caches the clock for the owner's current stretch of work:
	// reading it per packet cost a few percent of a bandwidth run. It is
	// dropped whenever ownership is taken and after every system call
	// (flush), so it is never older than one batch of work.
	now    time.Time
	nowSet bool

	// transmit batch
	txBufs [][]byte // backing buffers, MaxPacketLen each
	txOut  [][]byte // packets of the batch (prefixes of txBufs), without a GatherSender
	// With a GatherSender the batch is txG instead: a packet with
	// its payload in place is headers (txBufs), payload and trailer, and
	// txRegs holds the references to the payloads' memory until the send.
	txG    []transport.Gather
	txRegs []mr.Region
	txN    int
	txEP   transport.Endpoint
	txSize int
	// txResp: the batch holds a response (ACK, READ response);
	// txMixed: a request was added after one.
	txResp  bool
	txMixed bool
	txTmp   txScratch // for requestsFirst
}

// txScratch holds a batch's entries while requestsFirst reorders them.
type txScratch struct {
	bufs, out [][]byte
	g         []transport.Gather
	regs      []mr.Region
}

func newWorker(e *Engine, idx int) *worker {
	bs := e.conn.BatchSize()
	if bs <= 0 {
		bs = transport.DefaultBatchSize
	}
	w := &worker{
		e:       e,
		idx:     idx,
		events:  make(chan event, eventQueueLen),
		stop:    make(chan struct{}),
		qps:     make(map[uint32]*qpEntry),
		timer:   e.clock.NewTimer(),
		kickSet: make(map[uint32]bool),
		txBufs:  make([][]byte, bs),
		txOut:   make([][]byte, bs),
		txG:     make([]transport.Gather, bs),
		txRegs:  make([]mr.Region, bs),
		txSize:  bs,
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
	w.pending.Add(1)
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
	w.pending.Add(-1)
	return false
}

// offer hands ev to the worker goroutine unless its inbox is full.
func (w *worker) offer(ev event) bool {
	w.pending.Add(1)
	select {
	case w.events <- ev:
		return true
	default:
	}
	w.pending.Add(-1)
	return false
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

// kick asks the worker to run qpn's requester, coalescing repeated kicks.
func (w *worker) kick(qpn uint32) {
	w.kickMu.Lock()
	pending := w.kickSet[qpn]
	w.kickSet[qpn] = true
	owned := w.owned
	w.kickMu.Unlock()
	if pending || owned {
		return
	}
	w.enqueue(event{kind: evKick, qpn: qpn})
}

// tryInline runs f as the shard's owner in the calling goroutine if the
// worker is idle (and, with needIdle, nothing is queued for it), then
// flushes and rearms like the worker loop would. It reports whether f ran.
func (w *worker) tryInline(needIdle bool, f func()) bool {
	if !w.tryAcquire(needIdle) {
		return false
	}
	f()
	w.releaseInline()
	return true
}

// tryAcquire makes the calling goroutine the shard's owner if the worker
// is idle (and, with needIdle, nothing is queued for it).
func (w *worker) tryAcquire(needIdle bool) bool {
	if needIdle && w.pending.Load() != 0 {
		return false
	}
	if !w.own.TryLock() {
		return false
	}
	if needIdle && w.pending.Load() != 0 {
		w.own.Unlock()
		return false
	}
	w.inline = true
	w.setOwned()
	return true
}

// releaseInline ends an inline ownership taken by tryAcquire: answer
// window, kicked QPs, flush, rearm; QPs that still want to send are left
// to the worker goroutine.
func (w *worker) releaseInline() { w.release(false) }

// release is releaseInline, for a poller when polled: a poller gets no
// answer window (it answers after Poll returns), and a batch holding ACKs
// for messages it received is left unsent for that answer to join: the
// next owner sends it, and the worker goroutine is woken to be that owner
// if nobody else is first.
func (w *worker) release(polled bool) {
	keepBatch := polled && w.txN > 0 && w.received()
	if !polled {
		w.answerWindow()
	}
	w.settle()
	w.inline = false
	if !keepBatch {
		w.flush()
	}
	w.rearm()
	wake := keepBatch || len(w.ready) > 0
	w.own.Unlock()
	if wake {
		// A full inbox already guarantees the worker another round.
		w.offer(event{kind: evWake})
	}
}

// lockOwned makes the worker goroutine the shard's owner.
func (w *worker) lockOwned() {
	w.own.Lock()
	w.setOwned()
}

// received reports whether the current owner completed a receive (a
// SEND message) on the shard.
func (w *worker) received() bool { return w.ctr.RDMARecvs.Load() != w.recvsOwned }

// setOwned records (under own) that kicks are now the owner's to run, and
// the receive count received compares against.
func (w *worker) setOwned() {
	w.recvsOwned = w.ctr.RDMARecvs.Load()
	w.nowSet = false
	w.kickMu.Lock()
	w.owned = true
	w.kickMu.Unlock()
}

// settle runs every kicked QP until none is left, then stops taking
// kicks (later ones queue an event). Called under own, before flushing,
// so an answer posted during this round leaves with the round's batch.
func (w *worker) settle() {
	for {
		var nums [16]uint32
		n := 0
		w.kickMu.Lock()
		for qpn := range w.kickSet {
			if n == len(nums) {
				break
			}
			nums[n] = qpn
			n++
			delete(w.kickSet, qpn)
		}
		if n == 0 {
			w.owned = false
			w.kickMu.Unlock()
			return
		}
		w.kickMu.Unlock()
		for _, qpn := range nums[:n] {
			w.runQP(w.qps[qpn])
		}
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

// drain handles up to 256 events that are already queued.
func (w *worker) drain() {
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
			w.flush()
		}
	}
}

// flushEvery is how many queued events a worker handles before it sends
// what they produced.
const flushEvery = 16

func (w *worker) handle(ev event) {
	defer w.pending.Add(-1)
	switch ev.kind {
	case evPacket:
		w.handlePacket(ev.pkt, &ev.ep)
		ev.lease.Release()
	case evKick:
		w.kickMu.Lock()
		delete(w.kickSet, ev.qpn)
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

// parseDrop maps a Parse error to its drop reason.
func parseDrop(err error) qp.DropReason {
	switch {
	case errors.Is(err, wire.ErrTruncated):
		return qp.DropLength
	case errors.Is(err, wire.ErrBadOpcode):
		return qp.DropBadOpcode
	default:
		return qp.DropHeader
	}
}

// handlePacket runs the receive checks and the protocol for one datagram.
// pkt is only borrowed: nothing may keep it (or p.Raw) after the call.
func (w *worker) handlePacket(pkt []byte, ep *transport.Endpoint) {
	e := w.e
	p := &w.pkt
	// Multicast (mcast.go): a datagram to QP 0xFFFFFF goes to every QP
	// attached to its destination group. A CNP may name QP 0xFFFFFF too
	// (the conformance corpus has one): it is counted below.
	if b := wire.BTH(pkt[:wire.BTHLen]); b.DestQP() == McastQPN && b.Opcode() != wire.CNP {
		w.handleMcast(pkt, ep)
		return
	}
	// rxe_chk_dgid: the destination must be one of our GIDs (or a
	// multicast group: mcast.go). A kernel socket only delivers such
	// packets, but a wildcard bind or an injected packet may not be.
	if !e.isLocal(ep.Local.Addr()) && !transport.IsGroup(ep.Local.Addr()) {
		e.drop(qp.DropAddress)
		return
	}
	if err := p.Parse(pkt); err != nil {
		e.drop(parseDrop(err))
		return
	}
	w.ri = qp.RecvInfo{Src: ep.Remote, Dst: ep.Local}
	if p.Opcode == wire.CNP {
		if r := w.checkICRC(p.Raw, ep); r != qp.DropNone {
			e.drop(r)
			return
		}
		w.ctr.CNPRcvd.Add(1)
		return
	}
	ent := w.qps[p.BTH.DestQP()]
	if ent == nil {
		e.drop(qp.DropQP)
		return
	}
	q := ent.q
	var local netip.Addr
	if q.Type().Connected() {
		local = e.gid(q.AV().SGIDIndex)
	}
	if r := q.Check(p, &w.ri, local); r != qp.DropNone {
		e.drop(r)
		return
	}
	if r := w.checkICRC(p.Raw, ep); r != qp.DropNone {
		e.drop(r)
		return
	}
	q.Receive(w, p, &w.ri, w.clockNow())
	w.runQP(ent)
}

// checkICRC verifies the ICRC of a received packet and, over IPv4, that
// the Identification it solved to is one the peer could have sent (see
// ipv4id.go): without that check a corrupted IPv4 packet passes with
// probability 2^-15.
func (w *worker) checkICRC(raw []byte, ep *transport.Endpoint) qp.DropReason {
	v, id := (wire.Flow{Src: ep.Remote, Dst: ep.Local}).Verify(raw)
	if v != wire.ICRCOK {
		return qp.DropICRC
	}
	src := ep.Remote.Addr()
	if !src.Unmap().Is4() {
		return qp.DropNone
	}
	switch w.e.ids.admit(src, ep.Local.Addr(), id, w.clockNow()) {
	case idReject:
		return qp.DropIPv4ID
	case idResync:
		w.e.idResyncs.Add(1)
	}
	return qp.DropNone
}

// StartPersist implements qp.PersistEnv: the msync of a FLUSH to
// persistence runs in a goroutine of its own (a QP has at most one FLUSH
// waiting, so there are at most as many as QPs), and its result comes
// back to the worker as an event, which completes the FLUSH if the QP is
// still the one that asked. The worker and its other QPs carry on.
func (w *worker) StartPersist(q *qp.QP, reg mr.Region, t qp.PersistToken) {
	persist := w.persist
	if persist == nil {
		persist = (*mr.Region).Persist
	}
	w.e.persists.Add(1)
	go func() {
		defer w.e.persists.Done()
		err := persist(&reg)
		reg.Release()
		// On a closed engine nobody waits for the answer.
		w.enqueue(event{kind: evCall, fn: func() { w.persistDone(q, t, err) }})
	}()
}

// persistDone hands a FLUSH's msync result to its QP (on the worker).
func (w *worker) persistDone(q *qp.QP, t qp.PersistToken, err error) {
	ent := w.qps[q.Num()]
	if ent == nil || ent.q != q {
		return // destroyed meanwhile
	}
	q.PersistDone(w, t, err)
	w.runQP(ent)
}

// TxBuffer implements qp.Env.
func (w *worker) TxBuffer() []byte { return w.txBufs[w.txN] }

// Transmit implements qp.Env: seal the ICRC for the flow and add the
// packet to the batch, sending the batch when it is full or the
// destination changes.
func (w *worker) Transmit(n int, av *qp.AddrVector) error {
	ep, err := w.route(av)
	if err != nil {
		return err
	}
	pkt := w.txBufs[w.txN][:n]
	wire.Flow{Src: ep.Local, Dst: ep.Remote}.Seal(pkt)
	if w.e.gs != nil {
		w.txG[w.txN] = transport.Gather{pkt}
	} else {
		w.txOut[w.txN] = pkt
	}
	w.added()
	return nil
}

// TransmitPayload implements qp.PayloadEnv: with a Conn that sends in
// pieces, the payload leaves from the registered memory itself (the kernel
// copies it once, as it copies the headers); the region reference is
// released when the batch has been sent. Otherwise the payload is copied
// behind the headers and sent like Transmit.
func (w *worker) TransmitPayload(hdrLen int, payload []byte, reg mr.Region, n int, av *qp.AddrVector) error {
	if w.e.gs == nil {
		copy(w.txBufs[w.txN][hdrLen:], payload)
		reg.Release()
		return w.Transmit(n, av)
	}
	ep, err := w.route(av)
	if err != nil {
		reg.Release()
		return err
	}
	buf := w.txBufs[w.txN]
	trailer := buf[hdrLen : n-len(payload)] // pad, then the ICRC slot
	clear(trailer)
	wire.Flow{Src: ep.Local, Dst: ep.Remote}.SealGather(buf[:hdrLen], payload, trailer)
	w.txG[w.txN] = transport.Gather{buf[:hdrLen], payload, trailer}
	w.txRegs[w.txN] = reg
	w.added()
	return nil
}

// route resolves av to the batch's endpoint, flushing the batch first
// when the destination changes (the packet being built moves to the
// front of the next batch).
func (w *worker) route(av *qp.AddrVector) (transport.Endpoint, error) {
	e := w.e
	local := e.gid(av.SGIDIndex)
	remote := av.DGID.Unmap()
	if !local.IsValid() || !remote.IsValid() || local.Is4() != remote.Is4() {
		w.ctr.SendErr.Add(1)
		return transport.Endpoint{}, qp.ErrBadAV
	}
	dport := av.DestPort
	if dport == 0 {
		dport = transport.RoCEv2Port
	}
	ep := transport.Endpoint{
		Local:  netip.AddrPortFrom(local, e.ports[local]),
		Remote: netip.AddrPortFrom(remote, dport),
	}
	if k := w.txN; k > 0 && ep != w.txEP {
		// The packet was built in txBufs[k]; after the flush it becomes
		// the first of the next batch.
		w.flush()
		w.txBufs[0], w.txBufs[k] = w.txBufs[k], w.txBufs[0]
	}
	w.txEP = ep
	return ep, nil
}

// added counts the packet just put in the batch, sending a full batch.
func (w *worker) added() {
	if wire.Opcode(w.txBufs[w.txN][0]).Info().Flags.Has(wire.FlagResponse) {
		w.txResp = true
	} else if w.txResp {
		w.txMixed = true
	}
	w.txN++
	if w.txN == w.txSize {
		w.flush()
	}
}

// clockNow is the engine clock, read at most once per stretch of work.
func (w *worker) clockNow() time.Time {
	if !w.nowSet {
		w.now, w.nowSet = w.e.clock.Now(), true
	}
	return w.now
}

// flush sends the batch.
func (w *worker) flush() {
	w.nowSet = false
	if w.txN == 0 {
		return
	}
	if w.txMixed {
		w.requestsFirst()
	}
	w.txResp, w.txMixed = false, false
	var err error
	if w.e.gs != nil {
		err = w.e.gs.SendGather(w.txG[:w.txN], w.txEP)
		for i := range w.txN {
			w.txRegs[i].Release() // a no-op for packets without a region
			w.txG[i] = transport.Gather{}
		}
	} else {
		err = w.e.conn.Send(w.txOut[:w.txN], w.txEP)
	}
	if err != nil {
		w.ctr.SendErr.Add(uint64(w.txN))
		w.e.log.Debug("roce: send failed", "err", err, "n", w.txN)
	}
	w.txN = 0
}

// requestsFirst moves the batch's requests ahead of its responses,
// keeping the order within each (a QP's responses must stay in PSN order,
// and so must its requests; IBA orders nothing between the two
// directions). The typical batch is an ACK and the answer the application
// posted in the answer window: sent as [answer, ACK] the two are one UDP
// GSO message (a shorter datagram may end a run), which crosses the
// kernel once instead of twice; on loopback that is nearly half the cost
// of a SEND round trip.
func (w *worker) requestsFirst() {
	t := &w.txTmp
	n := w.txN
	gather := w.e.gs != nil
	k := 0
	for pass := 0; pass < 2; pass++ {
		wantResp := pass == 1
		for i := range n {
			if wire.Opcode(w.txBufs[i][0]).Info().Flags.Has(wire.FlagResponse) != wantResp {
				continue
			}
			t.bufs[k], t.regs[k] = w.txBufs[i], w.txRegs[i]
			if gather {
				t.g[k] = w.txG[i]
			} else {
				t.out[k] = w.txOut[i]
			}
			k++
		}
	}
	copy(w.txBufs, t.bufs[:n])
	copy(w.txRegs, t.regs[:n])
	clear(t.bufs[:n])
	clear(t.regs[:n])
	if gather {
		copy(w.txG, t.g[:n])
		clear(t.g[:n])
	} else {
		copy(w.txOut, t.out[:n])
		clear(t.out[:n])
	}
}

// localOps executes LOCAL_INV and BIND_MW with the engine's memory table.
type localOps struct{ e *Engine }

func (l localOps) Execute(q *qp.QP, wr *qp.SendWR) qp.WCStatus {
	switch wr.Opcode {
	case qp.WRLocalInv:
		if err := l.e.mem.Invalidate(q.PD(), q.Num(), wr.InvalidateRKey); err != nil {
			return qp.WCLocQPOpErr
		}
		return qp.WCSuccess
	case qp.WRBindMW:
		b := wr.Bind
		_, err := l.e.mem.BindMW(q.PD(), q.Num(), mr.Bind{MWKey: b.MWRKey, NewKey: b.NewRKey,
			MRKey: b.MRLKey, Addr: b.Addr, Length: b.Length, Access: mr.Access(b.Access)})
		if err != nil {
			return qp.WCMWBindErr
		}
		return qp.WCSuccess
	}
	return qp.WCLocQPOpErr
}
