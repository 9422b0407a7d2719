package transport

import "net/netip"

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
// The receive paths themselves are RxFilterConn's (rxfilter.go), which
// the daemon's traffic accounting shares; the receive-side faultDir is
// its filter.

// inline reports whether the faults can be decided as each datagram
// passes: nothing is held back or added.
func (c *FaultConfig) inline() bool {
	return c.Dup == 0 && c.Reorder == 0 && c.Delay == 0 && c.Jitter == 0 && c.DelayFunc == nil
}

// initReceive picks how f receives: through the inner Conn's lending and
// polling, filtered by the injector when its receive faults are inline
// (or untouched when there are none), or, when they are queued, copies of
// what Receive pops from the queue, polled when the inner Conn can be
// (faulty_poll.go).
func (f *Faulty) initReceive() {
	switch {
	case f.rx == nil:
		f.RxFilterConn = NewRxFilterConn(f.inner, nil)
	case f.rxq == nil:
		f.RxFilterConn = NewRxFilterConn(f.inner, f.rx)
	default:
		f.RxFilterConn = NewRxFilterConn(newQueuedRx(f), nil)
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

// FilterRx implements RxFilter for the receive direction's inline faults:
// the batch is judged under one lock; a lost datagram is dropped, a
// corrupted one has a bit flipped in place.
func (d *faultDir) FilterRx(b RxBatch) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return b.Partition(d.keepLocked)
}

// keepLocked runs one received datagram through the inline injector:
// false if it is lost; a corrupted one has a bit flipped in place. d.mu
// is held.
func (d *faultDir) keepLocked(data []byte) bool {
	v := d.decide(len(data))
	if v.corrupt {
		flipBit(data, v.bit)
	}
	return !v.lost
}
