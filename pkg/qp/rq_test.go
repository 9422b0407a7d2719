package qp

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func recvWR(id uint64, nsge int) RecvWR {
	wr := RecvWR{ID: id}
	for i := 0; i < nsge; i++ {
		wr.SGL = append(wr.SGL, SGE{Addr: id<<16 | uint64(i), Length: 64, LKey: uint32(i + 1)})
	}
	return wr
}

func TestNewRecvQueueSizes(t *testing.T) {
	for _, c := range [][2]int{{0, 1}, {-1, 1}, {0x4001, 1}, {1, -1}, {1, 33}} {
		_, err := NewRecvQueue(c[0], c[1])
		require.ErrorIs(t, err, ErrQueueSize, "%v", c)
	}
	q, err := NewRecvQueue(16, 0)
	require.NoError(t, err)
	require.Equal(t, 16, q.Cap())
	require.Equal(t, 0, q.MaxSGE())
	require.NoError(t, q.Post(&RecvWR{ID: 1}), "zero-SGE receives are allowed")
}

func TestRecvQueueFIFOAndCopy(t *testing.T) {
	q, err := NewRecvQueue(4, 3)
	require.NoError(t, err)
	_, ok := q.Peek()
	require.False(t, ok)
	require.False(t, q.Pop(nil))

	var dst RecvWR
	next, want := uint64(0), uint64(0)
	for lap := 0; lap < 5; lap++ {
		for k := 0; k < 3; k++ {
			wr := recvWR(next, int(next%4))
			if len(wr.SGL) > 3 {
				wr.SGL = wr.SGL[:3]
			}
			require.NoError(t, q.Post(&wr))
			// The queue copied the list: scribbling on ours changes nothing.
			for i := range wr.SGL {
				wr.SGL[i] = SGE{}
			}
			next++
		}
		for k := 0; k < 3; k++ {
			head, ok := q.Peek()
			require.True(t, ok)
			require.Equal(t, want, head.ID)
			exp := recvWR(want, min(int(want%4), 3))
			require.Equal(t, len(exp.SGL), len(head.SGL))
			for i := range exp.SGL {
				require.Equal(t, exp.SGL[i], head.SGL[i])
			}
			require.True(t, q.Pop(&dst))
			require.Equal(t, want, dst.ID)
			require.Equal(t, len(exp.SGL), len(dst.SGL))
			want++
		}
	}
	require.Zero(t, q.Len())
}

func TestRecvQueueMisuseChangesNothing(t *testing.T) {
	q, err := NewRecvQueue(2, 2)
	require.NoError(t, err)
	wr := recvWR(1, 3)
	err = q.Post(&wr)
	require.ErrorIs(t, err, ErrTooManySGE)
	require.Contains(t, err.Error(), "max_recv_sge 2")
	require.Zero(t, q.Len())

	ok1, ok2 := recvWR(1, 1), recvWR(2, 2)
	require.NoError(t, q.Post(&ok1))
	require.NoError(t, q.Post(&ok2))
	extra := recvWR(3, 1)
	err = q.Post(&extra)
	require.ErrorIs(t, err, ErrQueueFull)
	require.Equal(t, 2, q.Len())
	head, _ := q.Peek()
	require.Equal(t, uint64(1), head.ID)

	huge := RecvWR{ID: 9, SGL: []SGE{{Length: 1 << 31}, {Length: 1 << 31}}}
	q2, _ := NewRecvQueue(2, 2)
	require.ErrorIs(t, q2.Post(&huge), ErrMsgTooLong)
	require.Zero(t, q2.Len())
}

func TestRecvQueuePostList(t *testing.T) {
	q, err := NewRecvQueue(8, 1)
	require.NoError(t, err)
	wrs := []RecvWR{recvWR(1, 1), recvWR(2, 1), recvWR(3, 2), recvWR(4, 1)}
	n, err := q.PostList(wrs)
	require.Equal(t, 2, n, "stops at the bad request, like ibv_post_recv's bad_wr")
	require.ErrorIs(t, err, ErrTooManySGE)
	require.Equal(t, 2, q.Len())
	n, err = q.PostList(wrs[3:])
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

func TestRecvQueuePeekStableAcrossPosts(t *testing.T) {
	q, err := NewRecvQueue(3, 2)
	require.NoError(t, err)
	a := recvWR(10, 2)
	require.NoError(t, q.Post(&a))
	head, ok := q.Peek()
	require.True(t, ok)
	b, c := recvWR(11, 2), recvWR(12, 2)
	require.NoError(t, q.Post(&b))
	require.NoError(t, q.Post(&c))
	require.Equal(t, uint64(10), head.ID)
	require.Equal(t, recvWR(10, 2).SGL, head.SGL)
}

func TestRecvQueueFlush(t *testing.T) {
	q, err := NewRecvQueue(4, 2)
	require.NoError(t, err)
	for i := uint64(0); i < 3; i++ {
		wr := recvWR(i, 2)
		require.NoError(t, q.Post(&wr))
	}
	var ids []uint64
	n := q.Flush(func(wr RecvWR) {
		ids = append(ids, wr.ID)
		require.Len(t, wr.SGL, 2)
	})
	require.Equal(t, 3, n)
	require.Equal(t, []uint64{0, 1, 2}, ids)
	require.Zero(t, q.Len())
	require.Zero(t, q.Flush(nil))
	// Usable again after a flush (ERR -> RESET -> ... reuses the queue).
	wr := recvWR(5, 1)
	require.NoError(t, q.Post(&wr))
	require.Equal(t, 1, q.Flush(nil))

	q.Close()
	require.ErrorIs(t, q.Post(&wr), ErrQueueClosed)
}

func TestRecvQueueNoAllocs(t *testing.T) {
	q, err := NewRecvQueue(16, 4)
	require.NoError(t, err)
	wr := recvWR(1, 4)
	dst := RecvWR{SGL: make([]SGE, 0, 4)}
	allocs := testing.AllocsPerRun(100, func() {
		_ = q.Post(&wr)
		_, _ = q.Peek()
		q.Pop(&dst)
	})
	require.Zero(t, allocs)
}

func TestNewSRQ(t *testing.T) {
	for _, c := range [][3]int{{0, 1, 0}, {MaxSRQWR + 1, 1, 0}, {4, -1, 0}, {4, MaxSRQSGE + 1, 0}, {4, 1, -1}} {
		_, err := NewSRQ(c[0], c[1], c[2])
		require.Error(t, err, "%v", c)
	}
	s, err := NewSRQ(8, 2, 3)
	require.NoError(t, err)
	require.Equal(t, 3, s.Limit())
	require.Equal(t, 8, s.Cap())
}

// An SRQ created with max_sge 0 takes one SGE per receive, and one
// created with a limit above max_wr fires it with the first receive
// taken: rxe_srq_chk_init raises max_sge to RXE_MIN_SRQ_SGE and checks no
// srq_limit, which rxe_srq_from_init arms as given. rxed refused both.
func TestNewSRQAsRxeChecksIt(t *testing.T) {
	s, err := NewSRQ(4, 0, 5)
	require.NoError(t, err)
	require.Equal(t, 5, s.Limit())
	require.NoError(t, s.Post(&RecvWR{ID: 1, SGL: []SGE{{Length: 8}}}))
	require.ErrorIs(t, s.Post(&RecvWR{ID: 2, SGL: []SGE{{Length: 8}, {Length: 8}}}), ErrTooManySGE)
	require.NoError(t, s.Post(&RecvWR{ID: 3}))
	require.True(t, s.Pop(nil))
	require.Equal(t, uint64(1), s.LimitFired())
	require.Equal(t, 0, s.Limit(), "fired once and disarmed")
}

func TestSRQLimitEvent(t *testing.T) {
	s, err := NewSRQ(8, 1, 0)
	require.NoError(t, err)
	var handled int
	s.SetLimitHandler(func() { handled++ })
	for i := uint64(0); i < 8; i++ {
		wr := recvWR(i, 1)
		require.NoError(t, s.Post(&wr))
	}
	// Not armed: consuming fires nothing.
	require.True(t, s.Pop(nil))
	requireNoEvent(t, s.LimitEvents())

	require.NoError(t, s.ArmLimit(4))
	require.Equal(t, 4, s.Limit())
	for s.Len() > 4 {
		require.True(t, s.Pop(nil))
	}
	requireNoEvent(t, s.LimitEvents()) // 4 left is not below the limit
	require.Zero(t, handled)
	require.True(t, s.Pop(nil)) // 3 < 4: fire once and disarm
	requireEvent(t, s.LimitEvents())
	require.Equal(t, 1, handled)
	require.Zero(t, s.Limit())
	require.True(t, s.Pop(nil))
	requireNoEvent(t, s.LimitEvents())
	require.Equal(t, 1, handled)
	require.Equal(t, uint64(1), s.LimitFired())

	// Arming above the current count fires on the next consumption.
	require.Equal(t, 2, s.Len())
	require.NoError(t, s.ArmLimit(6))
	requireNoEvent(t, s.LimitEvents())
	require.True(t, s.Pop(nil))
	requireEvent(t, s.LimitEvents())
	require.Equal(t, 2, handled)

	// Flushing (SRQ destroy) never fires; 0 disarms.
	require.NoError(t, s.ArmLimit(5))
	require.NoError(t, s.ArmLimit(0))
	require.True(t, s.Pop(nil))
	requireNoEvent(t, s.LimitEvents())
	wr := recvWR(100, 1)
	require.NoError(t, s.Post(&wr))
	require.NoError(t, s.ArmLimit(3))
	require.Equal(t, 1, s.Flush(nil))
	requireNoEvent(t, s.LimitEvents())
	require.Equal(t, 2, handled)
}

func TestSRQArmLimitMisuse(t *testing.T) {
	s, err := NewSRQ(4, 1, 2)
	require.NoError(t, err)
	require.ErrorIs(t, s.ArmLimit(5), ErrSRQLimit)
	require.ErrorIs(t, s.ArmLimit(-1), ErrSRQLimit)
	require.Equal(t, 2, s.Limit(), "a refused limit changes nothing")
	s.Close()
	require.ErrorIs(t, s.ArmLimit(1), ErrQueueClosed)
	wr := recvWR(1, 1)
	require.ErrorIs(t, s.Post(&wr), ErrQueueClosed)
}

// Many QPs consume one SRQ while many goroutines post: every request is
// consumed exactly once and the limit event fires once per arm.
func TestSRQConcurrent(t *testing.T) {
	const posters, consumers, each = 4, 4, 500
	const total = posters * each
	s, err := NewSRQ(total, 1, 0)
	require.NoError(t, err)
	var fired sync.WaitGroup
	fired.Add(1)
	s.SetLimitHandler(func() { fired.Done() }) // a second call panics
	require.NoError(t, s.ArmLimit(1))

	// One token per posted request: a consumer holding a token is sure to
	// find a request, however the goroutines interleave.
	avail := make(chan struct{}, total)
	var post sync.WaitGroup
	for p := 0; p < posters; p++ {
		post.Add(1)
		go func(p int) {
			defer post.Done()
			for i := 0; i < each; i++ {
				wr := recvWR(uint64(p)<<32|uint64(i), 1)
				if err := s.Post(&wr); err != nil {
					t.Error(err)
					return
				}
				avail <- struct{}{}
			}
		}(p)
	}
	var mu sync.Mutex
	seen := make(map[uint64]bool)
	var cons sync.WaitGroup
	for c := 0; c < consumers; c++ {
		cons.Add(1)
		go func() {
			defer cons.Done()
			var dst RecvWR
			for range avail {
				if !s.Pop(&dst) {
					t.Error("token without a request")
					return
				}
				mu.Lock()
				if seen[dst.ID] {
					t.Errorf("request %#x consumed twice", dst.ID)
				}
				seen[dst.ID] = true
				mu.Unlock()
			}
		}()
	}
	post.Wait()
	close(avail)
	cons.Wait()
	require.Len(t, seen, total)
	require.Zero(t, s.Len())
	fired.Wait() // the queue ran dry at least at the end
	require.Equal(t, uint64(1), s.LimitFired())
}

func BenchmarkRecvQueuePostPop(b *testing.B) {
	q, _ := NewRecvQueue(256, 4)
	wr := recvWR(1, 4)
	dst := RecvWR{SGL: make([]SGE, 0, 4)}
	b.ReportAllocs()
	for b.Loop() {
		_ = q.Post(&wr)
		q.Pop(&dst)
	}
}
