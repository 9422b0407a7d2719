package transport

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Direction selects which traffic a Faulty conn disturbs.
type Direction uint8

const (
	DirBoth    Direction = iota // datagrams sent and received (the zero value)
	DirSend                     // only datagrams passed to Send
	DirReceive                  // only datagrams returned by Receive
)

func (d Direction) String() string {
	switch d {
	case DirBoth:
		return "both"
	case DirSend:
		return "send"
	case DirReceive:
		return "receive"
	}
	return fmt.Sprintf("Direction(%d)", uint8(d))
}

// DefaultReorderHold bounds how long a reordered datagram waits for later
// ones to overtake it, so the last datagram of a burst is late, not lost.
const DefaultReorderHold = time.Millisecond

// FaultConfig describes the faults NewFaulty injects. Each datagram in a
// faulted direction is, independently: lost with probability Loss;
// otherwise corrupted (one bit flipped, in a copy) with probability Corrupt;
// duplicated with probability Dup; held back with probability Reorder until
// ReorderDepth later datagrams have passed (or ReorderHold elapsed); and,
// if not held, delayed by Delay plus a uniform jitter in [0, Jitter), or by
// DelayFunc when set.
type FaultConfig struct {
	Loss, Dup, Reorder, Corrupt float64

	Delay  time.Duration
	Jitter time.Duration
	// DelayFunc, when set, draws each datagram's delay instead of
	// Delay+Jitter (any distribution); it must only use r for randomness.
	DelayFunc func(r *rand.Rand) time.Duration

	ReorderDepth int           // datagrams that overtake a held one; 0 means 1
	ReorderHold  time.Duration // longest hold; 0 means DefaultReorderHold

	// Seed makes a run reproducible: each direction draws from its own
	// generator seeded from it, so the decisions for the n-th datagram sent
	// (or received) are a function of Seed and n alone.
	Seed      int64
	Direction Direction
	// Clock times delays and holds; nil means the real clock. Tests pass a
	// ManualClock and advance it.
	Clock Clock
	// QueueLen bounds the datagrams waiting to be received when receive
	// faults are on; zero means DefaultMemQueueLen.
	QueueLen int
}

// Enabled reports whether cfg injects anything, so callers can skip the
// wrapper (and its receive goroutine) for an empty --fault spec.
func (c *FaultConfig) Enabled() bool {
	return c.Loss != 0 || c.Dup != 0 || c.Reorder != 0 || c.Corrupt != 0 ||
		c.Delay != 0 || c.Jitter != 0 || c.DelayFunc != nil
}

// Validate reports the first out-of-range field.
func (c *FaultConfig) Validate() error {
	for _, p := range []struct {
		name string
		v    float64
	}{{"loss", c.Loss}, {"dup", c.Dup}, {"reorder", c.Reorder}, {"corrupt", c.Corrupt}} {
		if math.IsNaN(p.v) || p.v < 0 || p.v > 1 {
			return fmt.Errorf("transport: fault %s=%v: probability must be in [0,1]", p.name, p.v)
		}
	}
	switch {
	case c.Delay < 0:
		return fmt.Errorf("transport: fault delay=%v: negative", c.Delay)
	case c.Jitter < 0:
		return fmt.Errorf("transport: fault jitter=%v: negative", c.Jitter)
	case c.ReorderDepth < 0:
		return fmt.Errorf("transport: fault depth=%d: negative", c.ReorderDepth)
	case c.ReorderHold < 0:
		return fmt.Errorf("transport: fault hold=%v: negative", c.ReorderHold)
	case c.Direction > DirReceive:
		return fmt.Errorf("transport: fault direction %v", c.Direction)
	case c.QueueLen < 0:
		return fmt.Errorf("transport: fault queue=%d: negative", c.QueueLen)
	}
	return nil
}

// FaultCounts is what a Faulty conn did to one direction's datagrams.
type FaultCounts struct {
	Seen       uint64 // datagrams that entered the injector
	Lost       uint64
	Duplicated uint64
	Reordered  uint64
	Corrupted  uint64
	Delayed    uint64
}

// Faulty is a Conn that injects faults into an inner Conn's traffic.
type Faulty struct {
	inner Conn
	cfg   FaultConfig
	clock Clock
	tx    *faultDir // nil when sends pass untouched
	rx    *faultDir // nil when receives pass untouched
	rxq   *pktQueue // nil when receives pass untouched or faults are inline
	rxOut counters  // drops of the receive queue
	// lateRefused counts the delayed or held datagrams the inner Conn
	// refused when the timer sent them (Stats.SendRefusedLate).
	lateRefused atomic.Uint64

	// Receiving without copies (faulty_inline.go): the inner Conn's
	// lending and polling, filtered by the injector when its receive
	// faults are inline, or a copying lender over Receive when they are
	// queued. It is f's Lender and Poller.
	*RxFilterConn

	// gs is the inner Conn's SendGather (nil when it has none);
	// SendGather's flat copies serve when the faults are not inline or the
	// inner Conn cannot gather (faulty_gather.go).
	gs     GatherSender
	flatMu sync.Mutex // guards flat
	flat   flattener

	once     sync.Once
	pumpDone chan struct{}
	// feedMu orders what enters the receive injector when it can be
	// polled: the pump holds it from taking a batch until the batch is
	// queued, a poller while it feeds one (faulty_poll.go).
	feedMu sync.Mutex
}

// NewFaulty wraps inner. It panics if cfg does not Validate: configurations
// from users go through ParseFaultSpec, which reports errors.
//
// Send-side faults act on copies: the caller's buffers are never modified.
// Receive-side faults that hold datagrams back or add some need a goroutine
// that keeps receiving from inner (so a delayed datagram can be delivered
// while nothing else arrives); it stops at Close. Loss and corruption alone
// are decided as each datagram is received (faulty_inline.go).
func NewFaulty(inner Conn, cfg FaultConfig) *Faulty {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	if cfg.ReorderDepth == 0 {
		cfg.ReorderDepth = 1
	}
	if cfg.ReorderHold == 0 {
		cfg.ReorderHold = DefaultReorderHold
	}
	if cfg.QueueLen == 0 {
		cfg.QueueLen = DefaultMemQueueLen
	}
	f := &Faulty{inner: inner, cfg: cfg, clock: cfg.Clock}
	f.gs, _ = inner.(GatherSender)
	if f.clock == nil {
		f.clock = realClock{}
	}
	if cfg.Direction != DirReceive {
		f.tx = newFaultDir(f, rand.NewPCG(uint64(cfg.Seed), 0x73656e64), f.flushSend) // "send"
	}
	if cfg.Direction != DirSend {
		f.rx = newFaultDir(f, rand.NewPCG(uint64(cfg.Seed), 0x72656376), f.flushRecv) // "recv"
		if !cfg.inline() {
			f.rxq = newPktQueue(cfg.QueueLen)
			f.pumpDone = make(chan struct{})
			if p, ok := inner.(Poller); ok && p.CanPoll() {
				go f.pumpLent(p) // and pollers feed the injector too
			} else {
				go f.pump()
			}
		}
	}
	f.initReceive()
	return f
}

// FaultStats returns what was injected so far, per direction.
func (f *Faulty) FaultStats() (send, receive FaultCounts) {
	if f.tx != nil {
		send = f.tx.snapshot()
	}
	if f.rx != nil {
		receive = f.rx.snapshot()
	}
	return send, receive
}

// Stats returns the inner Conn's counters (when it keeps them), plus the
// injector's own receive-queue drops.
func (f *Faulty) Stats() Stats {
	var s Stats
	if r, ok := f.inner.(StatsReporter); ok {
		s = r.Stats()
	}
	o := f.rxOut.snapshot()
	s.DropQueueFull += o.DropQueueFull
	s.DropOversize += o.DropOversize
	s.SendRefusedLate += f.lateRefused.Load()
	return s
}

func (f *Faulty) BatchSize() int               { return f.inner.BatchSize() }
func (f *Faulty) LocalAddrs() []netip.AddrPort { return f.inner.LocalAddrs() }

func (f *Faulty) Send(bufs [][]byte, ep Endpoint) error {
	if f.tx == nil {
		return f.inner.Send(bufs, ep)
	}
	for _, b := range bufs {
		if len(b) > MaxDatagramSize {
			return ErrTooLarge
		}
	}
	d := f.tx
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return errClosed
	}
	for i, b := range bufs {
		d.process(b, ep, i)
	}
	err := d.flush()
	d.rearm()
	return err
}

func (f *Faulty) Receive(bufs [][]byte, sizes []int, eps []Endpoint) (int, error) {
	if f.rxq == nil {
		// Untouched, or inline faults: the inner Conn's Receive, filtered.
		return f.RxFilterConn.Receive(bufs, sizes, eps)
	}
	if err := checkRecvArgs(bufs, sizes, eps); err != nil {
		return 0, err
	}
	n, _, over, err := f.rxq.pop(bufs, sizes, eps)
	f.rxOut.dropOversize.Add(over)
	return n, err
}

// pump receives from inner and feeds the receive-side injector.
func (f *Faulty) pump() {
	defer close(f.pumpDone)
	r := newRxSet(f.inner.BatchSize(), MaxDatagramSize)
	d := f.rx
	for {
		n, err := f.inner.Receive(r.bufs, r.sizes, r.eps)
		d.mu.Lock()
		if d.down {
			d.mu.Unlock()
			return
		}
		for i := range n {
			d.process(r.bufs[i][:r.sizes[i]], r.eps[i], -1)
		}
		_ = d.flush()
		d.rearm()
		d.mu.Unlock()
		if err != nil {
			f.rxq.shutdown(err, false)
			return
		}
	}
}

// Close closes the inner Conn and drops datagrams still delayed or held.
func (f *Faulty) Close() error {
	err := errClosed
	f.once.Do(func() {
		for _, d := range []*faultDir{f.tx, f.rx} {
			if d != nil {
				d.stop()
			}
		}
		err = f.inner.Close()
		if f.rxq != nil {
			f.rxq.shutdown(errClosed, true)
			<-f.pumpDone
		}
	})
	return err
}

// flushSend sends out, each run to one endpoint in one inner Send. Its
// error sums what every inner Send refused (the engine's send_err counts
// each refused datagram, not only the first Send's) and names, of the
// refused, those that the caller's Send handed over (fpkt.pos), as
// SendError.Index does; the others (copies the injector added, datagrams
// it held past their own call) count without a position.
func (f *Faulty) flushSend(out []*fpkt, scratch *[][]byte) error {
	bufs := *scratch
	var rf refusals
	for i := 0; i < len(out); {
		j := i + 1
		for j < len(out) && out[j].ep == out[i].ep {
			j++
		}
		bufs = bufs[:0]
		for _, p := range out[i:j] {
			bufs = append(bufs, p.buf)
		}
		if err := f.inner.Send(bufs, out[i].ep); err != nil {
			rf.addInner(err, j-i, func(k int) int { return out[i+k].pos })
		}
		i = j
	}
	clear(bufs)
	*scratch = bufs[:0]
	return rf.err()
}

func (f *Faulty) flushRecv(out []*fpkt, _ *[][]byte) error {
	for _, p := range out {
		if !f.rxq.push(p.buf, p.ep) {
			f.rxOut.dropQueueFull.Add(1)
		}
	}
	return nil
}

// fpkt is a datagram inside the injector. buf aliases the caller's memory
// until the datagram must outlive the call (held, delayed) or be modified
// (corrupted); then it is copied into mem, which is pooled.
type fpkt struct {
	buf   []byte
	mem   []byte
	ep    Endpoint
	pos   int // position in the Send that handed it over; -1: none (faultDir.process)
	due   time.Time
	seq   uint64
	after int  // reorder: datagrams still to overtake this one
	held  bool // in the reorder list (and in the heap, for ReorderHold)
	index int  // heap index
}

func (p *fpkt) own() {
	if len(p.buf) > 0 && (len(p.mem) == 0 || &p.buf[0] != &p.mem[0]) {
		p.mem = append(p.mem[:0], p.buf...)
		p.buf = p.mem
	}
}

type faultDir struct {
	f     *Faulty
	flush func() error

	mu        sync.Mutex // guards everything below
	rng       *rand.Rand
	counts    FaultCounts
	held      []*fpkt
	timed     timedHeap
	pool      []*fpkt
	out       []*fpkt
	outBufs   [][]byte
	gathers   []Gather  // SendGather's survivors (faulty_gather.go)
	gatherPos []int     // their positions in SendGather's dgrams
	flat      [1][]byte // a corrupted Gather's copy
	seq       uint64
	timer     Timer
	timerAt   time.Time
	down      bool
}

func newFaultDir(f *Faulty, src rand.Source, emit func([]*fpkt, *[][]byte) error) *faultDir {
	d := &faultDir{f: f, rng: rand.New(src)}
	d.flush = func() error {
		err := emit(d.out, &d.outBufs)
		for _, p := range d.out {
			d.recycle(p)
		}
		clear(d.out)
		d.out = d.out[:0]
		return err
	}
	return d
}

func (d *faultDir) snapshot() FaultCounts {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.counts
}

func (d *faultDir) get(data []byte, ep Endpoint, pos int) *fpkt {
	var p *fpkt
	if n := len(d.pool); n > 0 {
		p = d.pool[n-1]
		d.pool = d.pool[:n-1]
	} else {
		p = new(fpkt)
	}
	p.buf, p.ep, p.after, p.held, p.pos = data, ep, 0, false, pos
	return p
}

func (d *faultDir) recycle(p *fpkt) {
	p.buf = nil
	d.pool = append(d.pool, p)
}

// process runs one datagram through the injector; d.mu is held. pos is
// its position in the caller's Send, which its fpkt keeps while it goes
// out in that call (-1: none, a receive). The random
// draws happen in a fixed order and number per datagram, whatever the
// outcome, so the decisions for datagram n depend only on the seed and n.
func (d *faultDir) process(data []byte, ep Endpoint, pos int) {
	cfg := &d.f.cfg
	v := d.decide(len(data))
	if v.lost {
		return
	}
	p := d.get(data, ep, pos)
	if v.corrupt {
		p.own()
		flipBit(p.buf, v.bit)
	}
	rDup, rReorder, delay := v.rDup, v.rReorder, v.delay
	var dup *fpkt
	if rDup < cfg.Dup {
		d.counts.Duplicated++
		dup = d.get(p.buf, ep, -1) // not the call's: a refusal of it has no position
		if len(p.mem) > 0 && len(p.buf) > 0 && &p.buf[0] == &p.mem[0] {
			dup.own() // p's copy goes back to the pool independently
		}
	}
	now := d.f.clock.Now()
	switch {
	case rReorder < cfg.Reorder:
		d.counts.Reordered++
		p.own()
		p.pos = -1
		p.held, p.after = true, cfg.ReorderDepth
		d.held = append(d.held, p)
		d.schedule(p, now.Add(cfg.ReorderHold))
	case delay > 0:
		d.counts.Delayed++
		p.own()
		p.pos = -1
		d.schedule(p, now.Add(delay))
	default:
		d.emit(p)
	}
	if dup != nil {
		if delay > 0 {
			dup.own()
			d.schedule(dup, now.Add(delay))
		} else {
			d.emit(dup)
		}
	}
}

// verdict is what the injector decided for one datagram: lost, or
// corrupted at bit (modulo its length), and the draws for dup, reorder and
// delay, which only the queued path uses.
type verdict struct {
	lost, corrupt  bool
	bit            uint64
	rDup, rReorder float64
	delay          time.Duration
}

// decide makes the random draws for one datagram of n bytes, always the
// same ones in the same order whatever the outcome (so the decisions for
// datagram k depend only on the seed and k, on every path), and counts
// the loss and corruption they decide; d.mu is held.
func (d *faultDir) decide(n int) verdict {
	cfg := &d.f.cfg
	rLoss, rCorrupt := d.rng.Float64(), d.rng.Float64()
	v := verdict{rDup: d.rng.Float64(), rReorder: d.rng.Float64(), bit: d.rng.Uint64(), delay: cfg.Delay}
	if cfg.DelayFunc != nil {
		v.delay = cfg.DelayFunc(d.rng)
	} else if cfg.Jitter > 0 {
		v.delay += time.Duration(d.rng.Int64N(int64(cfg.Jitter)))
	}
	d.counts.Seen++
	switch {
	case rLoss < cfg.Loss:
		v.lost = true
		d.counts.Lost++
	case rCorrupt < cfg.Corrupt && n > 0:
		v.corrupt = true
		d.counts.Corrupted++
	}
	return v
}

// flipBit flips bit bit (modulo its length in bits) of b.
func flipBit(b []byte, bit uint64) {
	i := bit % uint64(len(b)*8)
	b[i/8] ^= 1 << (i % 8)
}

// emit stages p for delivery and lets held datagrams count it as one that
// overtook them.
func (d *faultDir) emit(p *fpkt) {
	d.out = append(d.out, p)
	kept := d.held[:0]
	for _, h := range d.held {
		h.after--
		if h.after > 0 {
			kept = append(kept, h)
			continue
		}
		h.held = false
		heap.Remove(&d.timed, h.index) // its ReorderHold deadline no longer applies
		d.out = append(d.out, h)
	}
	clear(d.held[len(kept):])
	d.held = kept
}

func (d *faultDir) schedule(p *fpkt, due time.Time) {
	d.seq++
	p.due, p.seq = due, d.seq
	heap.Push(&d.timed, p)
}

// release moves every due datagram to the output; d.mu is held.
func (d *faultDir) release(now time.Time) {
	for len(d.timed) > 0 && !d.timed[0].due.After(now) {
		p := heap.Pop(&d.timed).(*fpkt)
		switch {
		case p.held:
			// Held too long: deliver without counting as an overtaker.
			for i, h := range d.held {
				if h == p {
					d.held = append(d.held[:i], d.held[i+1:]...)
					break
				}
			}
			p.held = false
			d.out = append(d.out, p)
		default:
			d.emit(p)
		}
	}
}

// rearm points the timer at the earliest scheduled datagram; d.mu is held.
func (d *faultDir) rearm() {
	if d.down || len(d.timed) == 0 {
		return
	}
	due := d.timed[0].due
	if d.timer != nil && d.timerAt.Equal(due) {
		return
	}
	if d.timer != nil {
		d.timer.Stop()
	}
	d.timerAt = due
	d.timer = d.f.clock.AfterFunc(due.Sub(d.f.clock.Now()), d.onTimer)
}

func (d *faultDir) onTimer() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return
	}
	d.timer = nil
	d.release(d.f.clock.Now())
	// Like a network, a late datagram that fails to send is gone; but no
	// caller's Send reports its refusal, so it is counted here for the
	// engine's send_err (Stats.SendRefusedLate). Receive flushes refuse
	// nothing.
	n := len(d.out)
	if err := d.flush(); err != nil {
		d.f.lateRefused.Add(uint64(Refused(err, n)))
	}
	d.rearm()
}

func (d *faultDir) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down = true
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	d.timed = d.timed[:0]
	d.held = d.held[:0]
}

// timedHeap orders scheduled datagrams by due time, then scheduling order.
type timedHeap []*fpkt

func (h timedHeap) Len() int { return len(h) }
func (h timedHeap) Less(i, j int) bool {
	if !h[i].due.Equal(h[j].due) {
		return h[i].due.Before(h[j].due)
	}
	return h[i].seq < h[j].seq
}
func (h timedHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *timedHeap) Push(x any) {
	p := x.(*fpkt)
	p.index = len(*h)
	*h = append(*h, p)
}
func (h *timedHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return p
}
