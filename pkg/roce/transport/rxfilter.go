package transport

import "sync"

// Dropping received datagrams without hiding the inner Conn's fast paths.
//
// Two wrappers drop some of what a Conn receives: the fault injector
// (Faulty, whose inline faults lose a datagram or damage it in place) and
// the daemon's traffic accounting (internal/daemon: a READ request longer
// than its session allows). A wrapper that only implements Conn hides the
// inner Conn's lending and polling, and puts the engine on a copying
// receive path with a goroutine hand-off per batch: through the fault
// injector that path was 22% of a lossy run's CPU (issue 14, goal 7,
// docs/performance.md session K). Both wrappers had their own copy of the
// same five receive paths; RxFilterConn is that receive side written once,
// and each wrapper is only its RxFilter.
//
// A filter judges a whole batch in one call, so that it takes its lock
// or reads its clock once per batch, not per datagram. The datagrams it
// keeps move to the front in their order; a dropped lent datagram's lease
// is released after the filter returns (a release may take the lender's
// own lock, which must not nest inside the filter's).

// RxFilter decides which datagrams of a received batch are delivered.
type RxFilter interface {
	// FilterRx judges one batch, returning b.Partition's count of the
	// datagrams kept. It may modify a datagram in place (the memory is
	// the receiver's) and is called concurrently when the wrapped Conn is
	// received from concurrently.
	FilterRx(b RxBatch) int
}

// RxBatch is one received batch being judged: lent datagrams (with their
// endpoints and leases) or datagrams copied into a receiver's buffers
// (with their sizes).
type RxBatch struct {
	pkts   [][]byte // lent: the datagrams; copied: the buffers
	sizes  []int    // copied only: datagram i is pkts[i][:sizes[i]]
	eps    []Endpoint
	leases []*Lease // lent only
}

// Len is the number of datagrams in the batch.
func (b RxBatch) Len() int { return len(b.pkts) }

// Datagram returns datagram i.
func (b RxBatch) Datagram(i int) []byte {
	if b.sizes != nil {
		return b.pkts[i][:b.sizes[i]]
	}
	return b.pkts[i]
}

// Partition keeps the datagrams for which keep reports true, in order, at
// the front of the batch and returns their number. keep sees each datagram
// once, in order. A lent datagram is swapped into place (the dropped ones
// end up behind the kept, with their leases); a copied one is copied
// down over a dropped one (the receiver's buffers stay where they are),
// and is dropped too when that buffer is shorter than it (Receive's
// rule: dropped, never truncated).
func (b RxBatch) Partition(keep func([]byte) bool) int {
	k := 0
	for i := range b.pkts {
		if !keep(b.Datagram(i)) {
			continue
		}
		if k != i {
			if b.sizes != nil {
				if b.sizes[i] > len(b.pkts[k]) {
					continue
				}
				b.sizes[k] = copy(b.pkts[k], b.pkts[i][:b.sizes[i]])
				b.eps[k] = b.eps[i]
			} else {
				b.pkts[k], b.pkts[i] = b.pkts[i], b.pkts[k]
				b.eps[k], b.eps[i] = b.eps[i], b.eps[k]
				b.leases[k], b.leases[i] = b.leases[i], b.leases[k]
			}
		}
		k++
	}
	return k
}

// RxFilterConn is a Conn whose received datagrams pass an RxFilter, and
// which keeps the inner Conn's lending and polling (it is a Poller; it
// finds datagrams by polling only when the inner Conn can be polled). Send
// and the rest of Conn pass through the embedded inner Conn; a wrapper
// that also filters what it sends embeds RxFilterConn and implements Send
// (and SendGather) itself.
type RxFilterConn struct {
	Conn          // the inner Conn
	lender Lender // the inner Conn's lending, or copies of its Receive (Lend)
	poller Poller // nil when the inner Conn cannot be polled
	filter RxFilter
}

// NewRxFilterConn wraps inner; a nil filter delivers everything.
func NewRxFilterConn(inner Conn, filter RxFilter) *RxFilterConn {
	c := &RxFilterConn{Conn: inner, lender: Lend(inner), filter: filter}
	c.poller, _ = inner.(Poller)
	return c
}

// Receive implements Conn: the inner Conn's Receive, filtered. A batch the
// filter dropped entirely is followed by another receive.
func (c *RxFilterConn) Receive(bufs [][]byte, sizes []int, eps []Endpoint) (int, error) {
	for {
		n, err := c.Conn.Receive(bufs, sizes, eps)
		if k := c.filterCopied(n, bufs, sizes, eps); k > 0 || n == 0 || err != nil {
			return k, err
		}
	}
}

func (c *RxFilterConn) filterCopied(n int, bufs [][]byte, sizes []int, eps []Endpoint) int {
	if n == 0 || c.filter == nil {
		return n
	}
	return c.filter.FilterRx(RxBatch{pkts: bufs[:n], sizes: sizes[:n], eps: eps[:n]})
}

// filterLent runs a lent batch through the filter, releases the leases of
// the dropped datagrams, and returns how many are kept (at the front).
func (c *RxFilterConn) filterLent(n int, pkts [][]byte, eps []Endpoint, leases []*Lease) int {
	if n == 0 || c.filter == nil {
		return n
	}
	k := c.filter.FilterRx(RxBatch{pkts: pkts[:n], eps: eps[:n], leases: leases[:n]})
	for i := k; i < n; i++ {
		leases[i].Release()
		pkts[i], leases[i] = nil, nil
	}
	return k
}

// ReceiveLent implements Lender: the inner Conn's lent datagrams (or
// copies, when it does not lend), filtered.
func (c *RxFilterConn) ReceiveLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (int, error) {
	for {
		n, err := c.lender.ReceiveLent(pkts, eps, leases)
		if k := c.filterLent(n, pkts, eps, leases); k > 0 || n == 0 || err != nil {
			return k, err
		}
	}
}

// CanPoll implements Poller.
func (c *RxFilterConn) CanPoll() bool { return c.poller != nil && c.poller.CanPoll() }

// PollLent implements Poller.
func (c *RxFilterConn) PollLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (int, error) {
	if c.poller == nil {
		return 0, nil
	}
	n, err := c.poller.PollLent(pkts, eps, leases)
	return c.filterLent(n, pkts, eps, leases), err
}

// ReceiveLentLocked implements Poller. A batch the filter dropped entirely
// lets go of mu and waits again.
func (c *RxFilterConn) ReceiveLentLocked(pkts [][]byte, eps []Endpoint, leases []*Lease, mu sync.Locker) (int, error) {
	if c.poller == nil {
		n, err := c.ReceiveLent(pkts, eps, leases)
		if n > 0 {
			mu.Lock()
		}
		return n, err
	}
	for {
		n, err := c.poller.ReceiveLentLocked(pkts, eps, leases, mu)
		if n == 0 || err != nil {
			// mu is not held (the poller returns with it only when
			// n > 0 and err is nil).
			return c.filterLent(n, pkts, eps, leases), err
		}
		if n = c.filterLent(n, pkts, eps, leases); n > 0 {
			return n, nil
		}
		mu.Unlock()
	}
}

// WaitClosed implements CloseWaiter when the inner Conn does.
func (c *RxFilterConn) WaitClosed() {
	if w, ok := c.Conn.(CloseWaiter); ok {
		w.WaitClosed()
	}
}

// Cover implements Poller.
func (c *RxFilterConn) Cover() {
	if c.poller != nil {
		c.poller.Cover()
	}
}

// Uncover implements Poller.
func (c *RxFilterConn) Uncover() {
	if c.poller != nil {
		c.poller.Uncover()
	}
}
