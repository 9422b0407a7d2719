package transport

import (
	"errors"
	"sync"
	"sync/atomic"
)

// Lender is implemented by Conns that can lend their receive memory instead
// of copying datagrams out of it: the engine then parses each packet where
// the kernel put it, and the only copy of the payload left is the one into
// the destination buffer. Lend adapts any Conn.
type Lender interface {
	// ReceiveLent blocks like Conn.Receive, then returns up to len(pkts)
	// datagrams as views of memory the Conn lends: datagram i is pkts[i],
	// received on eps[i], and lives in leases[i] (several datagrams may
	// share one lease). The caller calls leases[i].Release() once per
	// datagram when it has finished with it and must not touch its bytes
	// after that. eps and leases must be at least as long as pkts. The
	// Conn lends a bounded amount of memory: when all of it is lent,
	// ReceiveLent waits for releases, as a NIC out of receive descriptors
	// does (the kernel socket buffer absorbs the wait, and overflows as it
	// would).
	ReceiveLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (n int, err error)
}

// Lease keeps a block of lent receive memory from being reused while
// datagrams in it are still being processed.
type Lease struct {
	refs atomic.Int32
	home leaseHome
}

// leaseHome takes lent memory back when its last reference is released.
type leaseHome interface{ recycle() }

// Release drops one reference; the last one returns the memory to its
// Conn. Releasing more often than references were handed out panics, since
// the memory could already be receiving other datagrams.
func (l *Lease) Release() {
	switch r := l.refs.Add(-1); {
	case r == 0:
		l.home.recycle()
	case r < 0:
		panic("transport: Lease released more often than lent")
	}
}

// open makes the lease hold its owner's reference (the Conn that is still
// handing datagrams out of the memory).
func (l *Lease) open() { l.refs.Store(1) }

// lend adds the references for n datagrams handed out.
func (l *Lease) lend(n int) {
	if n > 0 {
		l.refs.Add(int32(n))
	}
}

// MaxLentBatches bounds how many receive batches a UDP socket has lent out
// at once (each is BatchSize datagram slots, or fewer 64 KiB slots with
// GRO).
const MaxLentBatches = 8

// Lend returns c's own Lender when it has one (UDP), and otherwise an
// adapter that receives with Receive into buffers of its own and lends
// those, one lease per datagram, so the engine has one receive path for
// every Conn. The adapter's memory grows with the datagrams lent at once
// (the engine bounds that with its queues) and is reused, not freed.
func Lend(c Conn) Lender {
	if l, ok := c.(Lender); ok {
		return l
	}
	bs := c.BatchSize()
	if bs <= 0 {
		bs = DefaultBatchSize
	}
	return &copyLender{c: c, cur: make([]*copyBuf, bs), bufs: make([][]byte, bs), sizes: make([]int, bs)}
}

// copyLender lends single-datagram buffers it filled with Conn.Receive.
type copyLender struct {
	c Conn

	mu    sync.Mutex // serialises ReceiveLent
	cur   []*copyBuf // the buffers the next Receive fills
	bufs  [][]byte
	sizes []int

	freeMu sync.Mutex
	free   []*copyBuf
}

type copyBuf struct {
	lease Lease
	owner *copyLender
	b     [MaxDatagramSize]byte
}

func (b *copyBuf) recycle() {
	l := b.owner
	l.freeMu.Lock()
	l.free = append(l.free, b)
	l.freeMu.Unlock()
}

func (l *copyLender) get() *copyBuf {
	l.freeMu.Lock()
	defer l.freeMu.Unlock()
	if k := len(l.free); k > 0 {
		b := l.free[k-1]
		l.free[k-1] = nil
		l.free = l.free[:k-1]
		return b
	}
	b := &copyBuf{owner: l}
	b.lease.home = b
	return b
}

func (l *copyLender) ReceiveLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (int, error) {
	if len(eps) < len(pkts) || len(leases) < len(pkts) {
		return 0, errShortLend
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	k := min(len(pkts), len(l.cur))
	for i := range k {
		if l.cur[i] == nil {
			l.cur[i] = l.get()
		}
		l.bufs[i] = l.cur[i].b[:]
	}
	n, err := l.c.Receive(l.bufs[:k], l.sizes[:k], eps[:k])
	if err != nil {
		return 0, err
	}
	for i := range n {
		b := l.cur[i]
		l.cur[i] = nil
		b.lease.refs.Store(1)
		pkts[i] = b.b[:l.sizes[i]]
		leases[i] = &b.lease
	}
	return n, nil
}

var errShortLend = errors.New("transport: ReceiveLent: eps and leases must be as long as pkts")
