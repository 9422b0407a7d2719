package transport

import "sync"

// Polling a Faulty whose receive faults are queued.
//
// Faults that hold datagrams back or add some (dup, reorder, delay,
// jitter) go through the pump goroutine and its queue (faulty.go). That
// path could not be polled, and on a socket the pump waits in the Go
// netpoller. A goroutine spinning on its CQ (ib.HybridWaiter, the tools'
// default wait) yields with runtime.Gosched when it finds nothing, and a
// spinner in the run queue keeps the scheduler from consulting the
// netpoller (roce.ProgressOthers says why): the pump was woken only when
// the spin budget ran out and the spinner slept. Measured in a soak,
// `rxed kv bench` against kv serve: a GET's median went from 10 us to
// 280 us with any queued receive fault, even dup=0.00001 or delay=1ns
// (2 CPUs, GOMAXPROCS 1 or 2 alike): every round trip waited out the
// client's spin budget, so every test run with --fault dup, reorder or
// delay measured the wait instead of the protocol.
//
// So when the inner Conn can be polled, so can the Faulty: a poll takes
// what the queue holds and, when it is empty, what the inner Conn has
// received (PollLent, under feedMu), runs it through the injector as the
// pump would, and lends the queue's copies. The pump takes its batches
// with the inner Conn's ReceiveLentLocked under the same feedMu, so a
// poller never feeds a later batch into the injector before an earlier
// one the pump holds: arrival order, and with it the seed's decisions,
// are the same on both paths. A spinner's Cover reaches the inner Conn:
// its blocked receiver (the pump) steps aside while the spinner takes
// the datagrams.

// queuedRx is the receive side of a Faulty with queued receive faults:
// a Lender of the queue's copies, and a Poller when the inner Conn is
// one that can be polled.
type queuedRx struct {
	receiveOnly
	wait *copyLender // copies of the queue's datagrams, waiting for them
	poll *copyLender // the same, never waiting
	// inner is the inner Conn's polling, nil when it cannot be polled.
	inner Poller

	// Under f.feedMu: a poller's batch of the inner Conn's datagrams.
	pkts   [][]byte
	eps    []Endpoint
	leases []*Lease
}

func newQueuedRx(f *Faulty) *queuedRx {
	q := &queuedRx{receiveOnly: receiveOnly{f}}
	q.wait = Lend(receiveOnly{f}).(*copyLender)
	q.poll = Lend(queuePoller{receiveOnly{f}}).(*copyLender)
	if p, ok := f.inner.(Poller); ok && p.CanPoll() {
		q.inner = p
		n := max(f.inner.BatchSize(), 1)
		q.pkts, q.eps, q.leases = make([][]byte, n), make([]Endpoint, n), make([]*Lease, n)
	}
	return q
}

// queuePoller is f's queue seen as a Conn whose Receive never waits.
type queuePoller struct{ receiveOnly }

func (q queuePoller) Receive(bufs [][]byte, sizes []int, eps []Endpoint) (int, error) {
	if err := checkRecvArgs(bufs, sizes, eps); err != nil {
		return 0, err
	}
	n, over, err := q.f.rxq.tryPop(bufs, sizes, eps)
	q.f.rxOut.dropOversize.Add(over)
	return n, err
}

// ReceiveLent implements Lender: copies of the queue's datagrams.
func (q *queuedRx) ReceiveLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (int, error) {
	return q.wait.ReceiveLent(pkts, eps, leases)
}

// CanPoll implements Poller.
func (q *queuedRx) CanPoll() bool { return q.inner != nil }

// PollLent implements Poller: what the queue holds, else what the inner
// Conn has received, through the injector.
func (q *queuedRx) PollLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (int, error) {
	if q.inner == nil {
		return 0, nil
	}
	if n, err := q.poll.ReceiveLent(pkts, eps, leases); n > 0 || err != nil {
		return n, err
	}
	q.feed()
	return q.poll.ReceiveLent(pkts, eps, leases)
}

// feed runs what the inner Conn has received now through the injector,
// unless the pump is feeding it (it holds feedMu from the moment it took
// its batch).
func (q *queuedRx) feed() {
	f := q.f
	if !f.feedMu.TryLock() {
		return
	}
	n, _ := q.inner.PollLent(q.pkts, q.eps, q.leases) // its errors are the pump's to report
	f.injectLent(q.pkts[:n], q.eps[:n], q.leases[:n])
}

// ReceiveLentLocked implements Poller: it waits for the queue without mu,
// then takes its datagrams holding mu, so that a poller (which takes them
// under mu) never hands out later ones first.
func (q *queuedRx) ReceiveLentLocked(pkts [][]byte, eps []Endpoint, leases []*Lease, mu sync.Locker) (int, error) {
	for {
		if err := q.f.rxq.wait(); err != nil {
			return 0, err
		}
		mu.Lock()
		n, err := q.poll.ReceiveLent(pkts, eps, leases)
		if n > 0 {
			return n, nil
		}
		mu.Unlock()
		if err != nil {
			return 0, err
		}
	}
}

// Cover implements Poller: the inner Conn's receiver (the pump) steps
// aside while a spinner polls.
func (q *queuedRx) Cover() {
	if q.inner != nil {
		q.inner.Cover()
	}
}

// Uncover implements Poller.
func (q *queuedRx) Uncover() {
	if q.inner != nil {
		q.inner.Uncover()
	}
}

// pumpLent is the pump over an inner Conn that can be polled: it takes
// each batch holding feedMu (ReceiveLentLocked), so that pollers feed
// nothing newer before it has run the batch through the injector.
func (f *Faulty) pumpLent(p Poller) {
	defer close(f.pumpDone)
	n := max(f.inner.BatchSize(), 1)
	pkts, eps, leases := make([][]byte, n), make([]Endpoint, n), make([]*Lease, n)
	for {
		k, err := p.ReceiveLentLocked(pkts, eps, leases, &f.feedMu)
		if err != nil {
			f.rxq.shutdown(err, false)
			return
		}
		if k == 0 {
			continue // feedMu is held only with datagrams
		}
		if f.injectLent(pkts[:k], eps[:k], leases[:k]) {
			return
		}
	}
}

// injectLent runs a batch lent by the inner Conn through the injector
// (inject) with feedMu held, lets feedMu go, and hands the leases back;
// it reports whether the injector has stopped.
func (f *Faulty) injectLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (down bool) {
	down = f.inject(pkts, eps)
	f.feedMu.Unlock()
	for i := range pkts {
		leases[i].Release()
		pkts[i], leases[i] = nil, nil
	}
	return down
}

// inject runs received datagrams through the receive-side injector and
// queues what it delivers now; it reports whether the injector has
// stopped (Close).
func (f *Faulty) inject(pkts [][]byte, eps []Endpoint) (down bool) {
	d := f.rx
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return true
	}
	for i, b := range pkts {
		d.process(b, eps[i], -1)
	}
	_ = d.flush()
	d.rearm()
	return false
}
