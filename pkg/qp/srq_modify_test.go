package qp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// srqWith returns an SRQ of maxWR requests of 2 SGEs whose ring has
// wrapped (head in the middle) holding queued requests with IDs from 100,
// and armed with limit.
func srqWith(t *testing.T, maxWR, queued, limit int) *SRQ {
	t.Helper()
	s, err := NewSRQ(maxWR, 2, 0)
	require.NoError(t, err)
	// Wrap the ring: fill half, take it, so head is not slot 0.
	for i := range maxWR / 2 {
		wr := recvWR(uint64(i), 2)
		require.NoError(t, s.Post(&wr))
	}
	for range maxWR / 2 {
		require.True(t, s.Pop(nil))
	}
	for i := range queued {
		wr := recvWR(uint64(100+i), 1+i%2)
		require.NoError(t, s.Post(&wr))
	}
	if limit != 0 {
		require.NoError(t, s.ArmLimit(limit))
	}
	return s
}

// requireQueued pops every request and checks they are IDs from..from+n-1
// in order, each with the SGL it was posted with.
func requireQueued(t *testing.T, s *SRQ, from, n int) {
	t.Helper()
	var got RecvWR
	for i := range n {
		require.True(t, s.Pop(&got), "request %d of %d", i, n)
		want := recvWR(uint64(from+i), 1+i%2)
		require.Equal(t, want.ID, got.ID)
		require.Equal(t, want.SGL, got.SGL, "ID %d", want.ID)
	}
	require.False(t, s.Pop(nil), "nothing more queued")
}

// Every refusal of ibv_modify_srq on rxe (rxe_srq_chk_attr, and
// resize_finish for a queue smaller than the requests queued) is refused
// here with the matching sentinel, changing nothing: the size, the limit
// and the queued requests in order. rxed had no resize (ArmLimit only).
func TestSRQModifyRefusesWhatRxeRefuses(t *testing.T) {
	for _, c := range []struct {
		name                 string
		maxWR, queued, limit int
		attr                 SRQAttr
		mask                 SRQAttrMask
		want                 error
		wantMaxWR, wantLimit int
	}{
		{"max_wr 0", 8, 3, 0, SRQAttr{MaxWR: 0}, SRQMaxWR, ErrQueueSize, 8, 0},
		{"max_wr negative (a huge u32)", 8, 3, 0, SRQAttr{MaxWR: -1}, SRQMaxWR, ErrQueueSize, 8, 0},
		{"max_wr above max_srq_wr", 8, 3, 0, SRQAttr{MaxWR: MaxSRQWR + 1}, SRQMaxWR, ErrQueueSize, 8, 0},
		{"max_wr below the armed limit", 8, 3, 7, SRQAttr{MaxWR: 6}, SRQMaxWR, ErrQueueSize, 8, 7},
		{"max_wr below the armed limit, the limit lowered in the same call", 8, 2, 5, SRQAttr{MaxWR: 4, Limit: 1}, SRQMaxWR | SRQLimit, ErrQueueSize, 8, 5},
		{"max_wr below the requests queued", 8, 6, 0, SRQAttr{MaxWR: 5}, SRQMaxWR, ErrQueueSize, 8, 0},
		{"srq_limit negative", 8, 3, 0, SRQAttr{Limit: -1}, SRQLimit, ErrSRQLimit, 8, 0},
		{"srq_limit above max_wr", 8, 3, 2, SRQAttr{Limit: 9}, SRQLimit, ErrSRQLimit, 8, 2},
		{"srq_limit above the max_wr before the call's resize", 8, 3, 0, SRQAttr{MaxWR: 64, Limit: 9}, SRQMaxWR | SRQLimit, ErrSRQLimit, 8, 0},
		{"srq_limit above max_srq_wr", 8, 3, 0, SRQAttr{Limit: MaxSRQWR + 1}, SRQLimit, ErrSRQLimit, 8, 0},
		{"a good max_wr with a bad limit", 8, 3, 0, SRQAttr{MaxWR: 16, Limit: 20}, SRQMaxWR | SRQLimit, ErrSRQLimit, 8, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := srqWith(t, c.maxWR, c.queued, c.limit)
			err := s.Modify(c.attr, c.mask)
			require.ErrorIs(t, err, c.want)
			a, qerr := s.Query()
			require.NoError(t, qerr)
			require.Equal(t, SRQAttr{MaxWR: c.wantMaxWR, MaxSGE: 2, Limit: c.wantLimit}, a, "nothing changed")
			requireQueued(t, s, 100, c.queued)
		})
	}
	s := srqWith(t, 8, 3, 0)
	s.Close()
	require.ErrorIs(t, s.Modify(SRQAttr{MaxWR: 16}, SRQMaxWR), ErrQueueClosed)
	_, err := s.Query()
	require.ErrorIs(t, err, ErrQueueClosed)
}

// What rxe accepts: a resize to exactly the requests queued, to the
// armed limit, a grow with a new limit up to the old max_wr, a
// disarm, unknown mask bits (ignored by rxe) and an empty mask. The
// queued requests survive each resize in order, and the new size holds
// exactly max_wr.
func TestSRQModifyResizesKeepingTheQueueInOrder(t *testing.T) {
	for _, c := range []struct {
		name                 string
		maxWR, queued, limit int
		attr                 SRQAttr
		mask                 SRQAttrMask
		want                 SRQAttr // as Query reads it after
	}{
		{"grow", 8, 5, 0, SRQAttr{MaxWR: 32}, SRQMaxWR, SRQAttr{MaxWR: 32, MaxSGE: 2}},
		{"shrink to the requests queued", 8, 5, 0, SRQAttr{MaxWR: 5}, SRQMaxWR, SRQAttr{MaxWR: 5, MaxSGE: 2}},
		{"shrink an empty queue to 1", 8, 0, 0, SRQAttr{MaxWR: 1}, SRQMaxWR, SRQAttr{MaxWR: 1, MaxSGE: 2}},
		{"shrink to the armed limit", 8, 3, 4, SRQAttr{MaxWR: 4}, SRQMaxWR, SRQAttr{MaxWR: 4, MaxSGE: 2, Limit: 4}},
		{"grow and arm up to the old max_wr", 8, 3, 0, SRQAttr{MaxWR: 64, Limit: 8}, SRQMaxWR | SRQLimit, SRQAttr{MaxWR: 64, MaxSGE: 2, Limit: 8}},
		{"shrink and disarm", 8, 2, 3, SRQAttr{MaxWR: 3, Limit: 0}, SRQMaxWR | SRQLimit, SRQAttr{MaxWR: 3, MaxSGE: 2}},
		{"max_srq_wr", 8, 7, 0, SRQAttr{MaxWR: MaxSRQWR}, SRQMaxWR, SRQAttr{MaxWR: MaxSRQWR, MaxSGE: 2}},
		{"unknown bits ignored", 8, 3, 0, SRQAttr{MaxWR: -5, Limit: -5}, 1 << 2, SRQAttr{MaxWR: 8, MaxSGE: 2}},
		{"empty mask", 8, 3, 2, SRQAttr{MaxWR: 1}, 0, SRQAttr{MaxWR: 8, MaxSGE: 2, Limit: 2}},
		{"max_sge is not modifiable", 8, 3, 0, SRQAttr{MaxWR: 8, MaxSGE: 7}, SRQMaxWR, SRQAttr{MaxWR: 8, MaxSGE: 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := srqWith(t, c.maxWR, c.queued, c.limit)
			require.NoError(t, s.Modify(c.attr, c.mask))
			a, err := s.Query()
			require.NoError(t, err)
			require.Equal(t, c.want, a)
			require.Equal(t, c.want.MaxWR, s.Cap())
			require.Equal(t, c.queued, s.Len())
			// Fill to the new max_wr: it holds exactly that many.
			for i := c.queued; i < a.MaxWR && i < 64; i++ {
				wr := recvWR(uint64(100+i), 1+i%2)
				require.NoError(t, s.Post(&wr))
			}
			n := min(max(a.MaxWR, c.queued), 64)
			if n == a.MaxWR {
				wr := recvWR(1, 1)
				require.ErrorIs(t, s.Post(&wr), ErrQueueFull)
			}
			require.Zero(t, s.LimitFired(), "a resize fires no limit event")
			s.SetLimitHandler(nil)
			if a.Limit > 0 {
				require.NoError(t, s.ArmLimit(0)) // requireQueued counts takes, not events
			}
			requireQueued(t, s, 100, n)
		})
	}
}

// Posts and takes may run while the SRQ is resized (ibv_post_srq_recv and
// the QPs' receives are not held off by ibv_modify_srq): every request
// posted is taken once, in the order posted, whatever the interleaving,
// and each resize either happens between two of them or is refused for
// the requests queued then. Run under -race.
func TestSRQResizeRacingPostAndPop(t *testing.T) {
	const n = 2000
	s, err := NewSRQ(4, 1, 0)
	require.NoError(t, err)
	posted := make(chan struct{}, 1) // a request was posted
	popped := make(chan struct{}, 1) // a request was taken
	note := func(c chan struct{}) {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	// A bound for a broken SRQ that loses a request (the waits below
	// would never end), not a pace: the run takes milliseconds.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wait := func(c chan struct{}, what string) error {
		select {
		case <-c:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("stuck waiting for %s: len %d", what, s.Len())
		}
	}
	var wg sync.WaitGroup
	wg.Add(3)
	errs := make(chan error, 3)
	go func() { // the poster: in order, waiting for a take when full
		defer wg.Done()
		for i := 0; i < n; {
			wr := RecvWR{ID: uint64(i), SGL: []SGE{{Addr: uint64(i), Length: 1}}}
			switch err := s.Post(&wr); {
			case err == nil:
				i++
				note(posted)
			case errors.Is(err, ErrQueueFull):
				if err := wait(popped, "a take"); err != nil {
					errs <- err
					return
				}
			default:
				errs <- err
				return
			}
		}
	}()
	done := make(chan struct{})
	go func() { // the consumer: checks the order
		defer wg.Done()
		defer close(done)
		var wr RecvWR
		for i := 0; i < n; {
			if !s.Pop(&wr) {
				if err := wait(posted, fmt.Sprintf("post %d", i)); err != nil {
					errs <- err
					return
				}
				continue
			}
			if wr.ID != uint64(i) || len(wr.SGL) != 1 || wr.SGL[0].Addr != uint64(i) {
				errs <- fmt.Errorf("take %d got ID %d SGL %v", i, wr.ID, wr.SGL)
				return
			}
			i++
			note(popped)
		}
	}()
	go func() { // the resizer, until the consumer is done
		defer wg.Done()
		sizes := []int{1, 3, 16, 2, 64, 5, 1, 8}
		for k := 0; ; k++ {
			select {
			case <-done:
				return
			default:
			}
			err := s.Modify(SRQAttr{MaxWR: sizes[k%len(sizes)]}, SRQMaxWR)
			if err != nil && !errors.Is(err, ErrQueueSize) { // queued more than that: refused
				errs <- err
				return
			}
			if _, err := s.Query(); err != nil {
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	require.Zero(t, s.Len())
}
