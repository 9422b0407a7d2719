package qp

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// MaxCQE is the largest CQ rdma_rxe allows ((1 << RXE_MAX_LOG_CQE) - 1).
const MaxCQE = 1<<15 - 1

// CQ errors; test with errors.Is.
var (
	ErrCQOverflow = errors.New("qp: completion queue overflow")
	ErrCQClosed   = errors.New("qp: completion queue destroyed")
	ErrCQSize     = errors.New("qp: invalid completion queue size")
)

// notifyArm is how a CQ is armed for its next notification.
type notifyArm uint8

const (
	armNone      notifyArm = iota
	armNext                // IB_CQ_NEXT_COMP: the next completion of any kind
	armSolicited           // IB_CQ_SOLICITED: the next solicited or error completion
)

// CQ is a completion queue: a fixed-capacity ring of work completions.
// Engine goroutines Push, the consumer Polls; both are safe to call
// concurrently. Push and Poll do not allocate.
//
// Notification follows ibv_req_notify_cq / ibv_get_cq_event: ReqNotify
// arms the CQ once, the first completion that matches the arm fires one
// notification (on the channel from Notify and to the handler from
// SetNotifyHandler) and disarms it. Completions already queued when
// arming do not fire.
type CQ struct {
	mu       sync.Mutex
	ring     []WC
	head     int // index of the oldest completion
	count    int
	overflow bool
	closed   bool
	arm      notifyArm
	// Blocked Waits sleep on wake, a reusable one-token channel (a
	// channel per Wait would allocate per completion on a latency path).
	// Push and Close drop a token in when nwait > 0; a woken Wait that
	// leaves with completions queued (or the CQ closed) passes a token on
	// while others still wait, so every waiter is woken in turn, as a
	// broadcast would. A stale token costs one spurious, re-checked wake.
	wake     chan struct{}
	nwait    int
	notifyCh chan struct{}
	handler  func(*CQ)
	fired    uint64
}

// NewCQ returns a CQ holding up to cqe completions (1..MaxCQE).
func NewCQ(cqe int) (*CQ, error) {
	if cqe < 1 || cqe > MaxCQE {
		return nil, fmt.Errorf("%w: %d (want 1..%d)", ErrCQSize, cqe, MaxCQE)
	}
	return &CQ{ring: make([]WC, cqe), notifyCh: make(chan struct{}, 1), wake: make(chan struct{}, 1)}, nil
}

// Cap returns the number of completions the CQ holds.
func (cq *CQ) Cap() int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return len(cq.ring)
}

// Len returns the number of completions waiting to be polled.
func (cq *CQ) Len() int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.count
}

// Overflowed reports whether a Push ever found the CQ full. The flag is
// sticky: a CQ that lost a completion stays suspect (IBA: CQ error).
func (cq *CQ) Overflowed() bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.overflow
}

// Push appends wc. If the CQ is full the completion is dropped, the
// overflow flag is set and ErrCQOverflow is returned; the caller raises
// the CQ error asynchronous event, as rxe_cq_post does. Push on a closed
// CQ returns ErrCQClosed. A matching arm fires its notification after the
// completion is visible to Poll.
func (cq *CQ) Push(wc WC) error {
	cq.mu.Lock()
	if cq.closed {
		cq.mu.Unlock()
		return ErrCQClosed
	}
	if cq.count == len(cq.ring) {
		cq.overflow = true
		cq.mu.Unlock()
		return ErrCQOverflow
	}
	i := cq.head + cq.count
	if i >= len(cq.ring) {
		i -= len(cq.ring)
	}
	cq.ring[i] = wc
	cq.count++
	if cq.nwait > 0 {
		cq.signal()
	}
	fire := cq.arm == armNext ||
		(cq.arm == armSolicited && (wc.Solicited || wc.Status != WCSuccess))
	var h func(*CQ)
	if fire {
		cq.arm = armNone
		cq.fired++
		h = cq.handler
		select {
		case cq.notifyCh <- struct{}{}:
		default: // an event is already pending; like a comp channel it is not lost
		}
	}
	cq.mu.Unlock()
	if h != nil {
		h(cq)
	}
	return nil
}

// Poll moves up to len(wcs) completions, oldest first, into wcs and
// returns how many. It never blocks.
func (cq *CQ) Poll(wcs []WC) int {
	cq.mu.Lock()
	n := min(len(wcs), cq.count)
	for k := 0; k < n; k++ {
		wcs[k] = cq.ring[cq.head]
		cq.ring[cq.head] = WC{}
		cq.head++
		if cq.head == len(cq.ring) {
			cq.head = 0
		}
	}
	cq.count -= n
	cq.mu.Unlock()
	return n
}

// Wait blocks until the CQ holds at least one completion, ctx is done or
// the CQ is closed. It returns nil in the first case; the completion may
// still be taken by a concurrent Poll before the caller polls.
func (cq *CQ) Wait(ctx context.Context) error {
	cq.mu.Lock()
	for {
		switch {
		case cq.count > 0:
			cq.passOn()
			cq.mu.Unlock()
			return nil
		case cq.closed:
			cq.passOn()
			cq.mu.Unlock()
			return ErrCQClosed
		}
		cq.nwait++
		cq.mu.Unlock()
		var err error
		if done := ctx.Done(); done == nil {
			// A context that is never done (Background): a plain
			// receive, not a select over two channels (selectgo locks
			// every channel it waits on; an event-mode SEND ping-pong
			// waits twice a round trip).
			<-cq.wake
		} else {
			select {
			case <-cq.wake:
			case <-done:
				err = ContextError(ctx)
			}
		}
		cq.mu.Lock()
		cq.nwait--
		if err != nil {
			// A token meant for us may be in flight: hand it to the others.
			cq.passOn()
			cq.mu.Unlock()
			return err
		}
	}
}

// signal drops a wake-up token (never blocks: one pending token is enough,
// since every woken waiter re-checks and passes it on). Called under mu.
func (cq *CQ) signal() {
	select {
	case cq.wake <- struct{}{}:
	default:
	}
}

// passOn wakes the next waiter if the condition that woke this one still
// holds for them. Called under mu.
func (cq *CQ) passOn() {
	if cq.nwait > 0 && (cq.count > 0 || cq.closed) {
		cq.signal()
	}
}

// WaitPoll blocks like Wait, then polls; it returns at least one
// completion unless it returns an error.
func (cq *CQ) WaitPoll(ctx context.Context, wcs []WC) (int, error) {
	if len(wcs) == 0 {
		return 0, fmt.Errorf("qp: WaitPoll needs room for at least one completion")
	}
	for {
		if n := cq.Poll(wcs); n > 0 {
			return n, nil
		}
		if err := cq.Wait(ctx); err != nil {
			return 0, err
		}
	}
}

// ReqNotify arms the CQ for one notification, like ibv_req_notify_cq:
// with solicitedOnly the next solicited or unsuccessful completion fires
// it, otherwise the next completion of any kind. Arming for any
// completion takes precedence over a pending solicited-only arm, as in
// rxe.
func (cq *CQ) ReqNotify(solicitedOnly bool) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed {
		return ErrCQClosed
	}
	if !solicitedOnly {
		cq.arm = armNext
	} else if cq.arm != armNext {
		cq.arm = armSolicited
	}
	return nil
}

// Notify returns the channel a fired notification is delivered on, like a
// completion channel read with ibv_get_cq_event. It has room for one
// event: notifications fired while one is pending merge into it.
func (cq *CQ) Notify() <-chan struct{} { return cq.notifyCh }

// SetNotifyHandler installs fn to be called, in the goroutine that pushed
// the completion and without CQ locks held, each time a notification
// fires (the kernel's comp_handler). nil removes it.
//
// With pkg/roce that goroutine owns the QP's shard while it runs fn (the
// shard's worker, or a goroutine owning it inline: the receive loop, an
// application polling or posting), so fn must not block, and must not call an
// engine verb that waits for the worker (Engine.ModifyQP, QueryQP,
// DestroyQP, CreateQP): the worker would wait for itself and deadlock.
// It may Poll and ReqNotify this CQ and hand work to another goroutine.
// pkg/ib's CQ shadows this method with one whose handler runs on a
// goroutine of its own and may call any verb.
func (cq *CQ) SetNotifyHandler(fn func(*CQ)) {
	cq.mu.Lock()
	cq.handler = fn
	cq.mu.Unlock()
}

// Notifications returns how many notifications have fired.
func (cq *CQ) Notifications() uint64 {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.fired
}

// Resize changes the capacity to cqe, keeping the queued completions in
// order, like ibv_resize_cq. It fails without changing anything if cqe is
// out of range or smaller than the number of queued completions.
func (cq *CQ) Resize(cqe int) error {
	if cqe < 1 || cqe > MaxCQE {
		return fmt.Errorf("%w: %d (want 1..%d)", ErrCQSize, cqe, MaxCQE)
	}
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed {
		return ErrCQClosed
	}
	if cqe < cq.count {
		return fmt.Errorf("%w: %d is less than the %d queued completions", ErrCQSize, cqe, cq.count)
	}
	ring := make([]WC, cqe)
	for k := 0; k < cq.count; k++ {
		ring[k] = cq.ring[(cq.head+k)%len(cq.ring)]
	}
	cq.ring, cq.head = ring, 0
	return nil
}

// Close destroys the CQ: later Push and ReqNotify fail with ErrCQClosed
// and blocked Waits return it. Completions still queued can be polled.
// Closing twice is harmless.
func (cq *CQ) Close() {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed {
		return
	}
	cq.closed = true
	cq.arm = armNone
	if cq.nwait > 0 {
		cq.signal()
	}
}
