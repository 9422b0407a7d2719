package transport

import "sync"

// pktQueue is a bounded FIFO of datagrams with a blocking, closable pop,
// the receive side of MemNetwork and of the fault injector. Slots keep their
// buffers' capacity, so a steady stream allocates nothing.
type pktQueue struct {
	mu     sync.Mutex // guards slots, head, count, down, err
	slots  []queueSlot
	head   int
	count  int
	down   bool
	err    error // returned once the queue is empty after shutdown
	notify chan struct{}
	closed chan struct{}
	popMu  sync.Mutex // serialises poppers
}

type queueSlot struct {
	buf []byte
	ep  Endpoint
}

func newPktQueue(n int) *pktQueue {
	return &pktQueue{slots: make([]queueSlot, n), notify: make(chan struct{}, 1), closed: make(chan struct{})}
}

// push copies data in; it reports false when the queue is full or shut.
func (q *pktQueue) push(data []byte, ep Endpoint) bool {
	q.mu.Lock()
	if q.down || q.count == len(q.slots) {
		q.mu.Unlock()
		return false
	}
	s := &q.slots[(q.head+q.count)%len(q.slots)]
	s.buf = append(s.buf[:0], data...)
	s.ep = ep
	q.count++
	q.mu.Unlock()
	q.wake()
	return true
}

func (q *pktQueue) wake() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// shutdown makes pop return err (net.ErrClosed if nil) once the queued
// datagrams are gone; with discard they are dropped at once.
func (q *pktQueue) shutdown(err error, discard bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.down {
		return
	}
	q.down = true
	if err == nil {
		err = errClosed
	}
	q.err = err
	if discard {
		q.count = 0
	}
	close(q.closed)
}

// pop blocks until at least one datagram is queued or the queue is shut,
// then copies out up to len(bufs). Datagrams longer than their buffer are
// dropped and counted in oversize.
func (q *pktQueue) pop(bufs [][]byte, sizes []int, eps []Endpoint) (n int, nbytes uint64, oversize uint64, err error) {
	q.popMu.Lock()
	defer q.popMu.Unlock()
	for {
		q.mu.Lock()
		n, nbytes, oversize = q.takeLocked(bufs, sizes, eps, n, nbytes, oversize)
		more, down, qerr := q.count > 0, q.down, q.err
		q.mu.Unlock()
		if n > 0 {
			if more {
				q.wake() // keep the wake-up for the next caller
			}
			return n, nbytes, oversize, nil
		}
		if down {
			return 0, 0, oversize, qerr
		}
		select {
		case <-q.notify:
		case <-q.closed:
		}
	}
}

// takeLocked copies queued datagrams out into bufs from index n on,
// adding to the counts it is given; a datagram longer than its buffer is
// dropped and counted in oversize. q.mu is held.
func (q *pktQueue) takeLocked(bufs [][]byte, sizes []int, eps []Endpoint, n int, nbytes, oversize uint64) (int, uint64, uint64) {
	for n < len(bufs) && q.count > 0 {
		s := &q.slots[q.head]
		q.head = (q.head + 1) % len(q.slots)
		q.count--
		if len(s.buf) > len(bufs[n]) {
			oversize++
			continue
		}
		sizes[n] = copy(bufs[n], s.buf)
		eps[n] = s.ep
		nbytes += uint64(sizes[n])
		n++
	}
	return n, nbytes, oversize
}

// tryPop is pop that never waits: 0 datagrams (and a nil error) when the
// queue is empty and open, or when another popper is at it.
func (q *pktQueue) tryPop(bufs [][]byte, sizes []int, eps []Endpoint) (n int, oversize uint64, err error) {
	if !q.popMu.TryLock() {
		return 0, 0, nil
	}
	defer q.popMu.Unlock()
	q.mu.Lock()
	n, _, oversize = q.takeLocked(bufs, sizes, eps, 0, 0, 0)
	more, down, qerr := q.count > 0, q.down, q.err
	q.mu.Unlock()
	if more {
		q.wake() // a waiter may take the rest
	}
	if n == 0 && down && !more {
		return 0, oversize, qerr
	}
	return n, oversize, nil
}

// wait blocks until a datagram is queued (nil) or the queue is shut and
// empty (its error), taking nothing.
func (q *pktQueue) wait() error {
	for {
		q.mu.Lock()
		count, down, qerr := q.count, q.down, q.err
		q.mu.Unlock()
		if count > 0 {
			return nil
		}
		if down {
			return qerr
		}
		select {
		case <-q.notify:
		case <-q.closed:
		}
	}
}
