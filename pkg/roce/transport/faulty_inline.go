package transport

import (
	"net/netip"
	"sync"
)

// Receiving through a Faulty conn without copies.
//
// Faults that only lose or corrupt a datagram need no queue and no clock:
// the injector can decide as each datagram is received, in the receiving
// goroutine, and drop or damage it where it lies. Those that hold one back
// (delay, jitter, reorder) or add one (dup) need the pump goroutine and its
// queue. The queued path copied every datagram twice (into the pump's
// buffers, then into a lender's) and hid the inner Conn's lending and
// polling from the engine, so `rxed perf read --fault loss=0.01` measured
// the injector's path as much as the protocol's recovery: at loss 1e-7 it
// moved 0.61-0.85x of a run without the wrapper, and a CPU profile of the
// client at 1% loss spent 22% in the injector's copies (issue 14, goal 7:
// docs/performance.md session K). Inline faults now filter the inner
// Conn's lent datagrams (a lost one's lease is released at once, a
// corrupted one is damaged in place: the memory is the receiver's) and
// its polls, so with loss alone the engine keeps the data path it has
// without faults. The decisions are the same draws in the same order
// (faultDir.decide), so a seed picks the same datagrams on either path.

// inline reports whether the faults can be decided as each datagram
// passes: nothing is held back or added.
func (c *FaultConfig) inline() bool {
	return c.Dup == 0 && c.Reorder == 0 && c.Delay == 0 && c.Jitter == 0 && c.DelayFunc == nil
}

// initLending picks how f lends received datagrams, and whether it can be
// polled: through the inner Conn's lending and polling when nothing is
// queued (no receive faults, or inline ones), otherwise copies of what
// Receive returns.
func (f *Faulty) initLending() {
	il, innerLends := f.inner.(Lender)
	ip, innerPolls := f.inner.(Poller)
	switch {
	case f.rxq == nil && innerLends && f.rx == nil:
		f.lend = il
	case f.rxq == nil && innerLends:
		f.lend = inlineLender{f, il}
	default:
		f.lend = newCopyLender(receiveOnly{f})
	}
	if f.rxq == nil && innerPolls {
		f.poller = ip
	}
}

// receiveOnly is f seen only as a Conn, for a copying lender over its
// Receive (f itself is a Lender, and Lend would hand f back).
type receiveOnly struct{ f *Faulty }

func (q receiveOnly) Send(bufs [][]byte, ep Endpoint) error { return q.f.Send(bufs, ep) }
func (q receiveOnly) Receive(bufs [][]byte, sizes []int, eps []Endpoint) (int, error) {
	return q.f.Receive(bufs, sizes, eps)
}
func (q receiveOnly) Close() error                 { return q.f.Close() }
func (q receiveOnly) BatchSize() int               { return q.f.BatchSize() }
func (q receiveOnly) LocalAddrs() []netip.AddrPort { return q.f.LocalAddrs() }

// inlineLender is the inner Conn's lending, filtered by inline faults.
type inlineLender struct {
	f     *Faulty
	inner Lender
}

func (l inlineLender) ReceiveLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (int, error) {
	for {
		n, err := l.inner.ReceiveLent(pkts, eps, leases)
		if n = l.f.filterLent(pkts[:n], eps, leases); n > 0 || err != nil {
			return n, err
		}
	}
}

// keepLocked runs one received datagram through the inline injector:
// false if it is lost; a corrupted one has a bit flipped in place. d.mu
// is held (once per batch).
func (d *faultDir) keepLocked(data []byte) bool {
	v := d.decide(len(data))
	if v.corrupt {
		flipBit(data, v.bit)
	}
	return !v.lost
}

// receiveInline is Receive with inline faults: the survivors of each batch
// move down over the lost ones (a copy only behind a loss).
func (f *Faulty) receiveInline(bufs [][]byte, sizes []int, eps []Endpoint) (int, error) {
	d := f.rx
	for {
		n, err := f.inner.Receive(bufs, sizes, eps)
		k := 0
		d.mu.Lock()
		for i := range n {
			if !d.keepLocked(bufs[i][:sizes[i]]) {
				continue
			}
			if k != i {
				sizes[k] = copy(bufs[k], bufs[i][:sizes[i]])
				eps[k] = eps[i]
			}
			k++
		}
		d.mu.Unlock()
		if k > 0 || err != nil {
			return k, err
		}
	}
}

// filterLent drops the lost datagrams of a lent batch and returns how many
// are left, moved to the front in order. The batch is judged under one
// lock; the lost ones, swapped behind the survivors, have their leases
// released after it (a release may take the lender's own lock).
func (f *Faulty) filterLent(pkts [][]byte, eps []Endpoint, leases []*Lease) int {
	d := f.rx
	if d == nil {
		return len(pkts)
	}
	k := 0
	d.mu.Lock()
	for i := range pkts {
		if !d.keepLocked(pkts[i]) {
			continue
		}
		pkts[k], pkts[i] = pkts[i], pkts[k]
		eps[k], eps[i] = eps[i], eps[k]
		leases[k], leases[i] = leases[i], leases[k]
		k++
	}
	d.mu.Unlock()
	for i := k; i < len(pkts); i++ {
		leases[i].Release()
		pkts[i], leases[i] = nil, nil
	}
	return k
}

// ReceiveLent implements Lender: the inner Conn's lent datagrams, filtered
// by inline faults, or copies (initLending).
func (f *Faulty) ReceiveLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (int, error) {
	return f.lend.ReceiveLent(pkts, eps, leases)
}

// CanPoll implements Poller: the inner Conn can be polled and the faults,
// if any, are inline.
func (f *Faulty) CanPoll() bool { return f.poller != nil && f.poller.CanPoll() }

// PollLent implements Poller.
func (f *Faulty) PollLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (int, error) {
	if f.poller == nil {
		return 0, nil
	}
	n, err := f.poller.PollLent(pkts, eps, leases)
	return f.filterLent(pkts[:n], eps, leases), err
}

// ReceiveLentLocked implements Poller. A batch that was all lost lets go
// of mu and waits again.
func (f *Faulty) ReceiveLentLocked(pkts [][]byte, eps []Endpoint, leases []*Lease, mu sync.Locker) (int, error) {
	if f.poller == nil {
		n, err := f.ReceiveLent(pkts, eps, leases)
		if n > 0 {
			mu.Lock()
		}
		return n, err
	}
	for {
		n, err := f.poller.ReceiveLentLocked(pkts, eps, leases, mu)
		if err != nil {
			return n, err
		}
		if n = f.filterLent(pkts[:n], eps, leases); n > 0 {
			return n, nil
		}
		mu.Unlock()
	}
}

// Cover implements Poller.
func (f *Faulty) Cover() {
	if f.poller != nil {
		f.poller.Cover()
	}
}

// Uncover implements Poller.
func (f *Faulty) Uncover() {
	if f.poller != nil {
		f.poller.Uncover()
	}
}
