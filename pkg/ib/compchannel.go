package ib

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/rxed/rxed/pkg/qp"
)

// CompChannel is a completion event channel (struct ibv_comp_channel):
// the CQs created on it deliver their notifications to it, so one
// goroutine can wait for whichever CQ fires first, as a program does with
// ibv_get_cq_event on a channel shared by several CQs. A CQ still fires
// only when armed with ReqNotify, once per arm; the usual loop is
// GetCQEvent, ReqNotify on that CQ, then Poll it empty.
//
// Goroutine safety: every method may be called from any goroutine;
// several goroutines in GetCQEvent each receive distinct events.
type CompChannel struct {
	d       *Device
	mu      sync.Mutex
	pending []*CQ         // fired, not yet returned by GetCQEvent
	ready   chan struct{} // signalled when pending becomes non-empty
	done    chan struct{} // closed by Destroy
	users   int           // CQs created on the channel, not destroyed
	closed  bool
}

// ErrChannelClosed is returned by GetCQEvent on a destroyed channel.
var ErrChannelClosed = errors.New("ib: completion channel destroyed")

// CreateCompChannel creates a completion event channel
// (ibv_create_comp_channel).
func (d *Device) CreateCompChannel() *CompChannel {
	return &CompChannel{d: d, ready: make(chan struct{}, 1), done: make(chan struct{})}
}

// CreateCQOnChannel creates a CQ of at least cqe entries whose
// notifications go to ch (ibv_create_cq with a channel). The CQ's own
// Notify channel is not used then, and SetNotifyHandler refuses it.
func (d *Device) CreateCQOnChannel(cqe int, ch *CompChannel) (*CQ, error) {
	if ch == nil {
		return nil, errors.New("ib: CreateCQOnChannel: nil channel")
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed {
		return nil, wrap("CreateCQOnChannel", ErrChannelClosed)
	}
	cq, err := d.newCQ(cqe, ch)
	if err != nil {
		return nil, err
	}
	ch.users++
	return cq, nil
}

// deliver queues cq's notification; it runs in the goroutine that pushed
// the completion and does not block. A CQ already released (destroyed)
// gets no event: release, under the same lock, dropped its others.
func (ch *CompChannel) deliver(cq *CQ) {
	ch.mu.Lock()
	if !ch.closed && !cq.released.Load() {
		ch.pending = append(ch.pending, cq)
	}
	ch.mu.Unlock()
	select {
	case ch.ready <- struct{}{}:
	default:
	}
}

// GetCQEvent waits for the next notification of any CQ on the channel
// and returns that CQ (ibv_get_cq_event), in the order they fired: one
// event per fired arm, never merged. The events of a CQ destroyed before
// they were read are dropped, as the kernel drops them. It returns ctx's
// error when ctx is done first, ErrChannelClosed once the channel is
// destroyed and ErrDeviceClosed once its device is closed (after the
// notifications already fired).
//
// There is no ibv_ack_cq_events: the event holds no reference that a
// destroy must wait for (the CQ returned stays valid memory for as long
// as the caller keeps it), so CQ.Destroy neither blocks on unacknowledged
// events, as ibv_destroy_cq does, nor fails because of them.
func (ch *CompChannel) GetCQEvent(ctx context.Context) (*CQ, error) {
	for {
		ch.mu.Lock()
		if ch.closed {
			ch.mu.Unlock()
			return nil, ErrChannelClosed
		}
		if len(ch.pending) > 0 {
			cq := ch.pending[0]
			ch.pending[0] = nil
			ch.pending = ch.pending[1:]
			ch.mu.Unlock()
			return cq, nil
		}
		ch.mu.Unlock()
		if ch.d.down.Load() {
			return nil, ErrDeviceClosed
		}
		select {
		case <-ch.ready:
		case <-ch.done:
		case <-ch.d.done:
		case <-ctx.Done():
			return nil, qp.ContextError(ctx)
		}
	}
}

// Destroy destroys the channel (ibv_destroy_comp_channel). It fails with
// ErrBusy while CQs created on it exist; GetCQEvent calls blocked on it
// return ErrChannelClosed.
func (ch *CompChannel) Destroy() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.users > 0 {
		return fmt.Errorf("%w: completion channel used by %d CQs", ErrBusy, ch.users)
	}
	if !ch.closed {
		ch.closed = true
		ch.pending = nil
		close(ch.done)
	}
	return nil
}

// release is called when cq, a CQ on the channel, is destroyed (after
// cq.released is set). Its events nobody has read yet are dropped, as
// ib_uverbs_release_ucq frees a destroyed CQ's entries of the channel's
// event list: GetCQEvent never returns a destroyed CQ, whose ReqNotify
// would fail in a loop that re-arms what it is handed.
func (ch *CompChannel) release(cq *CQ) {
	ch.mu.Lock()
	ch.users--
	kept := ch.pending[:0]
	for _, c := range ch.pending {
		if c != cq {
			kept = append(kept, c)
		}
	}
	clear(ch.pending[len(kept):])
	ch.pending = kept
	ch.mu.Unlock()
}
