package qp

import (
	"errors"
	"fmt"
	"sync"
)

// Receive queue limits from rxe_param.h.
const (
	MaxSRQWR  = 0x4000 // RXE_MAX_SRQ_WR
	MaxSRQSGE = 27     // RXE_MAX_SRQ_SGE
)

// Receive queue errors; test with errors.Is.
var (
	ErrQueueFull   = errors.New("qp: receive queue full")
	ErrQueueSize   = errors.New("qp: invalid receive queue size")
	ErrQueueClosed = errors.New("qp: receive queue destroyed")
	ErrSRQLimit    = errors.New("qp: invalid SRQ limit")
)

// RecvQueue is a bounded FIFO of receive work requests: a QP's own
// receive queue, or the shared queue inside an SRQ. Post may be called
// from any goroutine; the responder consumes with Peek and Pop. Posted
// SGE lists are copied into storage preallocated at creation, so the
// caller may reuse its slices at once and Post and Pop do not allocate.
type RecvQueue struct {
	mu     sync.Mutex
	slots  []RecvWR // SGL of slot i aliases sges[i*maxSGE:]
	sges   []SGE
	maxSGE int
	head   int
	count  int
	closed bool

	// SRQ limit (IBV_SRQ_LIMIT): armed when limit > 0.
	limit        int
	limitHandler func()
	limitCh      chan struct{}
	limitFired   uint64
}

// NewRecvQueue returns a queue of maxWR requests with up to maxSGE
// entries each. maxWR must be at least 1; maxSGE may be 0 (receives
// that only take immediate data or zero-length sends).
func NewRecvQueue(maxWR, maxSGE int) (*RecvQueue, error) {
	if maxWR < 1 || maxWR > int(DefaultLimits.MaxQPWR) {
		return nil, fmt.Errorf("%w: max_wr %d (want 1..%d)", ErrQueueSize, maxWR, DefaultLimits.MaxQPWR)
	}
	if maxSGE < 0 || maxSGE > int(DefaultLimits.MaxRecvSGE) {
		return nil, fmt.Errorf("%w: max_sge %d (want 0..%d)", ErrQueueSize, maxSGE, DefaultLimits.MaxRecvSGE)
	}
	return newRecvQueue(maxWR, maxSGE), nil
}

func newRecvQueue(maxWR, maxSGE int) *RecvQueue {
	q := &RecvQueue{maxSGE: maxSGE, limitCh: make(chan struct{}, 1)}
	q.slots, q.sges = makeSlots(maxWR, maxSGE)
	return q
}

// makeSlots returns n empty request slots, each SGL a window of maxSGE
// entries into the one backing array returned with them (a post copies
// into its slot, nothing is allocated per request).
func makeSlots(n, maxSGE int) ([]RecvWR, []SGE) {
	slots, sges := make([]RecvWR, n), make([]SGE, n*maxSGE)
	for i := range slots {
		slots[i].SGL = sges[i*maxSGE : i*maxSGE : (i+1)*maxSGE]
	}
	return slots, sges
}

// Cap returns max_wr, the number of requests the queue holds (an SRQ's
// changes with SRQ.Modify, hence the lock).
func (q *RecvQueue) Cap() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.slots)
}

// MaxSGE returns max_sge, the most SGEs one request may have.
func (q *RecvQueue) MaxSGE() int { return q.maxSGE }

// Len returns the number of requests posted and not yet consumed.
func (q *RecvQueue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.count
}

// Post appends wr, copying its SGE list. A request with too many SGEs or
// a full queue is refused with an error and nothing changes.
func (q *RecvQueue) Post(wr *RecvWR) error {
	if err := CheckRecvWR(uint32(q.maxSGE), wr); err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return ErrQueueClosed
	}
	if q.count == len(q.slots) {
		return fmt.Errorf("%w: %d requests posted (max_wr %d)", ErrQueueFull, q.count, len(q.slots))
	}
	i := q.head + q.count
	if i >= len(q.slots) {
		i -= len(q.slots)
	}
	s := &q.slots[i]
	s.ID = wr.ID
	s.SGL = append(s.SGL[:0], wr.SGL...)
	q.count++
	return nil
}

// PostList posts wrs in order like ibv_post_recv, stopping at the first
// one that fails: it returns how many were posted and that error; the
// failing request and those after it are not posted.
func (q *RecvQueue) PostList(wrs []RecvWR) (int, error) {
	for i := range wrs {
		if err := q.Post(&wrs[i]); err != nil {
			return i, err
		}
	}
	return len(wrs), nil
}

// Peek returns the oldest request without consuming it, or false if the
// queue is empty. The pointer stays valid, and its contents unchanged,
// until that request is consumed by Pop or Flush (an SRQ resize moves
// the request but leaves the old copy as it was); this lets the
// responder fill one receive across the packets of a multi-packet SEND.
func (q *RecvQueue) Peek() (*RecvWR, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.count == 0 {
		return nil, false
	}
	return &q.slots[q.head], true
}

// Pop consumes the oldest request, copying it into dst (dst.SGL is reused
// if it has room, so the copy does not allocate in steady state). It
// returns false if the queue is empty. dst may be nil to drop the
// request. On an SRQ with an armed limit, the pop that leaves fewer
// requests than the limit fires the limit event and disarms it.
func (q *RecvQueue) Pop(dst *RecvWR) bool {
	q.mu.Lock()
	if q.count == 0 {
		q.mu.Unlock()
		return false
	}
	s := &q.slots[q.head]
	if dst != nil {
		dst.ID = s.ID
		dst.SGL = append(dst.SGL[:0], s.SGL...)
	}
	q.advance()
	var h func()
	if q.limit > 0 && q.count < q.limit {
		q.limit = 0
		q.limitFired++
		h = q.limitHandler
		select {
		case q.limitCh <- struct{}{}:
		default:
		}
	}
	q.mu.Unlock()
	if h != nil {
		h()
	}
	return true
}

// advance drops the head slot; q.mu must be held.
func (q *RecvQueue) advance() {
	s := &q.slots[q.head]
	s.ID = 0
	s.SGL = s.SGL[:0]
	q.head++
	if q.head == len(q.slots) {
		q.head = 0
	}
	q.count--
}

// Flush consumes every queued request, oldest first, calling fn for each
// (the request, its SGL included, is only valid during the call). The
// engine uses it on the move to ERR to complete them with WR_FLUSH_ERR.
// It returns the number flushed and never fires the SRQ limit event. fn
// may be nil; it must not call back into the queue.
func (q *RecvQueue) Flush(fn func(RecvWR)) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := q.count
	for q.count > 0 {
		if fn != nil {
			fn(q.slots[q.head])
		}
		q.advance()
	}
	return n
}

// Close destroys the queue: later Posts fail with ErrQueueClosed. Queued
// requests stay for Flush.
func (q *RecvQueue) Close() {
	q.mu.Lock()
	q.closed = true
	q.limit = 0
	q.mu.Unlock()
}

// SRQ is a shared receive queue, like ibv_srq: one RecvQueue consumed by
// several QPs, with a limit event (IBV_EVENT_SRQ_LIMIT_REACHED).
type SRQ struct {
	*RecvQueue
}

// NewSRQ returns an SRQ of maxWR requests (1..MaxSRQWR) with up to maxSGE
// entries each (0..MaxSRQSGE; 0 gets 1), armed with limit if it is not 0,
// like ibv_create_srq with srq_limit. As rxe_srq_chk_init it raises a
// max_sge below RXE_MIN_SRQ_SGE (1) instead of refusing it, and it does
// not hold srq_limit against max_wr (libibverbs calls it irrelevant to
// ibv_create_srq; rxe_srq_from_init arms it as given): a limit above
// maxWR fires with the first receive taken.
func NewSRQ(maxWR, maxSGE int, limit int) (*SRQ, error) {
	if maxWR < 1 || maxWR > MaxSRQWR {
		return nil, fmt.Errorf("%w: max_wr %d (want 1..%d)", ErrQueueSize, maxWR, MaxSRQWR)
	}
	if maxSGE < 0 || maxSGE > MaxSRQSGE {
		return nil, fmt.Errorf("%w: max_sge %d (want 0..%d)", ErrQueueSize, maxSGE, MaxSRQSGE)
	}
	maxSGE = max(maxSGE, 1) // RXE_MIN_SRQ_SGE
	if limit < 0 {
		return nil, fmt.Errorf("%w: %d is negative", ErrSRQLimit, limit)
	}
	s := &SRQ{newRecvQueue(maxWR, maxSGE)}
	s.limit = limit
	return s, nil
}

// ArmLimit sets srq_limit, like ibv_modify_srq with IBV_SRQ_LIMIT: when a
// consumer takes a request and fewer than limit remain, the limit event
// fires once and the SRQ disarms (the limit reads back as 0). A limit of
// 0 disarms. As in rxe, arming above the current count does not fire at
// once; the event comes with the next consumption. A limit larger than
// max_wr is refused and nothing changes.
func (s *SRQ) ArmLimit(limit int) error {
	return s.Modify(SRQAttr{Limit: limit}, SRQLimit)
}

// Limit returns the armed srq_limit, 0 when disarmed (ibv_query_srq).
func (s *SRQ) Limit() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limit
}

// LimitEvents returns the channel a fired limit event is delivered on. It
// has room for one event; events fired while one is pending merge.
func (s *SRQ) LimitEvents() <-chan struct{} { return s.limitCh }

// SetLimitHandler installs fn to be called, in the consuming goroutine and
// without locks held, each time the limit event fires. nil removes it. fn
// must not block.
func (s *SRQ) SetLimitHandler(fn func()) {
	s.mu.Lock()
	s.limitHandler = fn
	s.mu.Unlock()
}

// LimitFired returns how many limit events have fired.
func (s *SRQ) LimitFired() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limitFired
}
