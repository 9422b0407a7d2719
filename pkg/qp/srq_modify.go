package qp

import "fmt"

// SRQAttrMask selects what SRQ.Modify changes (enum ibv_srq_attr_mask).
type SRQAttrMask uint32

// SRQ attribute bits, with libibverbs' values.
const (
	SRQMaxWR SRQAttrMask = 1 << 0 // IBV_SRQ_MAX_WR: resize the queue
	SRQLimit SRQAttrMask = 1 << 1 // IBV_SRQ_LIMIT: arm (or disarm) the limit event
)

// SRQAttr is struct ibv_srq_attr: what SRQ.Query reports and SRQ.Modify
// takes (its MaxSGE is query-only: ibv_modify_srq cannot change it).
type SRQAttr struct {
	MaxWR  int // max_wr: requests the SRQ holds
	MaxSGE int // max_sge: SGEs per request
	Limit  int // srq_limit: 0 when disarmed
}

// Modify resizes the SRQ and/or arms its limit, like ibv_modify_srq on
// rdma_rxe, all or nothing: a refused modify changes nothing. rxe's
// rules (rxe_srq_chk_attr, then rxe_queue_resize's resize_finish):
//   - SRQMaxWR: max_wr in 1..MaxSRQWR (ErrQueueSize), not below an armed
//     limit (ErrQueueSize: rxe checks the limit armed before this call,
//     not one this call sets), not below the requests queued
//     (ErrQueueSize). The queued requests stay, in order: the next
//     consumer takes the oldest.
//   - SRQLimit: srq_limit in 0..max_wr, the max_wr before this call's
//     resize (ErrSRQLimit), as rxe checks it against the queue it has.
//
// Bits other than these two are ignored, as rxe ignores them. A closed
// SRQ fails with ErrQueueClosed. rxe frees the SRQ's queue when a resize
// fails in resize_finish (rxe_srq_from_attr's error path), which leaves
// the SRQ unusable; rxed keeps it, as ibv_modify_srq(3) promises.
//
// Concurrency: Modify takes the queue's lock, as Post and Pop do, so a
// resize is one step between posts and takes: a Post before it is moved
// into the new queue, a Post after it finds the new size (a Post that
// found the old queue full failed with ErrQueueFull and posted nothing);
// a Pop takes the oldest request whichever side of the resize it runs on.
// No request is lost, duplicated or reordered. Resizing fires no limit
// event (rxe's does not look at the limit either).
func (s *SRQ) Modify(a SRQAttr, mask SRQAttrMask) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrQueueClosed
	}
	if err := s.checkModify(a, mask); err != nil {
		return err
	}
	if mask&SRQMaxWR != 0 {
		s.resize(a.MaxWR)
	}
	if mask&SRQLimit != 0 {
		s.limit = a.Limit
	}
	return nil
}

// checkModify is rxe_srq_chk_attr and resize_finish's count check, in
// their order, against the SRQ as it is; s.mu must be held.
func (s *SRQ) checkModify(a SRQAttr, mask SRQAttrMask) error {
	if mask&SRQMaxWR != 0 {
		switch {
		case a.MaxWR < 1 || a.MaxWR > MaxSRQWR:
			return fmt.Errorf("%w: max_wr %d (want 1..%d)", ErrQueueSize, a.MaxWR, MaxSRQWR)
		case s.limit > 0 && a.MaxWR < s.limit:
			return fmt.Errorf("%w: max_wr %d is below the armed srq_limit %d", ErrQueueSize, a.MaxWR, s.limit)
		}
	}
	if mask&SRQLimit != 0 && (a.Limit < 0 || a.Limit > len(s.slots)) {
		return fmt.Errorf("%w: %d (want 0..%d)", ErrSRQLimit, a.Limit, len(s.slots))
	}
	if mask&SRQMaxWR != 0 && a.MaxWR < s.count {
		return fmt.Errorf("%w: max_wr %d is below the %d requests queued", ErrQueueSize, a.MaxWR, s.count)
	}
	return nil
}

// resize moves the queued requests, oldest first, into a queue of n
// slots (n at least the count); s.mu must be held. A pointer Peek gave
// out still reads its request as it was: the old slots are not written
// again.
func (q *RecvQueue) resize(n int) {
	slots, sges := makeSlots(n, q.maxSGE)
	for i := range q.count {
		j := q.head + i
		if j >= len(q.slots) {
			j -= len(q.slots)
		}
		slots[i].ID = q.slots[j].ID
		slots[i].SGL = append(slots[i].SGL, q.slots[j].SGL...)
	}
	q.slots, q.sges, q.head = slots, sges, 0
}

// Query returns max_wr, max_sge and srq_limit (ibv_query_srq); a closed
// SRQ fails with ErrQueueClosed.
func (s *SRQ) Query() (SRQAttr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return SRQAttr{}, ErrQueueClosed
	}
	return SRQAttr{MaxWR: len(s.slots), MaxSGE: s.maxSGE, Limit: s.limit}, nil
}
