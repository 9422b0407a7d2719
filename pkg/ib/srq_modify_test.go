package ib_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/stretchr/testify/require"
)

// SRQ.Modify refuses what ibv_modify_srq on rxe refuses (rxe_srq_chk_attr;
// rxe_queue_resize for fewer slots than receives queued), with this
// package's sentinels, changing nothing; Query reads max_wr, max_sge and
// srq_limit back as ibv_query_srq does. pkg/ib had neither: no resize
// and no query of max_wr or max_sge.
func TestSRQModifyAndQueryAsRxe(t *testing.T) {
	a, _, _, _ := testPair(t)
	srq, err := a.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 8, MaxSGE: 0, Limit: 0})
	require.NoError(t, err)
	got, err := srq.Query()
	require.NoError(t, err)
	require.Equal(t, ib.SRQAttr{MaxWR: 8, MaxSGE: 1}, got, "max_sge 0 reads as the 1 it got")
	for i := range 5 {
		require.NoError(t, srq.PostRecv(ib.RecvWR{ID: uint64(i), SGL: []ib.SGE{a.sge(i*8, 8)}}))
	}
	require.NoError(t, srq.ArmLimit(3))
	for _, c := range []struct {
		name string
		attr ib.SRQAttr
		mask ib.SRQAttrMask
		is   error
	}{
		{"max_wr 0", ib.SRQAttr{MaxWR: 0}, ib.SRQMaxWR, ib.ErrSRQSize},
		{"max_wr above max_srq_wr", ib.SRQAttr{MaxWR: ib.MaxSRQWR + 1}, ib.SRQMaxWR, ib.ErrSRQSize},
		{"max_wr below the receives queued", ib.SRQAttr{MaxWR: 4}, ib.SRQMaxWR, ib.ErrSRQSize},
		{"max_wr below the armed limit", ib.SRQAttr{MaxWR: 2}, ib.SRQMaxWR, ib.ErrSRQSize},
		{"srq_limit above max_wr", ib.SRQAttr{Limit: 9}, ib.SRQLimit, ib.ErrSRQLimit},
		{"srq_limit above the max_wr before the resize", ib.SRQAttr{MaxWR: 32, Limit: 9}, ib.SRQMaxWR | ib.SRQLimit, ib.ErrSRQLimit},
		{"srq_limit negative", ib.SRQAttr{Limit: -1}, ib.SRQLimit, ib.ErrSRQLimit},
	} {
		err := srq.Modify(&c.attr, c.mask)
		require.ErrorIs(t, err, c.is, c.name)
		require.Regexp(t, `^ib: SRQ.Modify: `, err.Error(), c.name)
		require.NotRegexp(t, doubledPrefix, err.Error(), c.name)
		got, err := srq.Query()
		require.NoError(t, err)
		require.Equal(t, ib.SRQAttr{MaxWR: 8, MaxSGE: 1, Limit: 3}, got, "%s changed nothing", c.name)
		require.Equal(t, 5, srq.Len(), c.name)
	}
	require.NoError(t, srq.Modify(&ib.SRQAttr{MaxWR: 5, Limit: 8}, ib.SRQMaxWR|ib.SRQLimit),
		"both checked against the SRQ before the call: max_wr 5 >= limit 3, limit 8 <= max_wr 8")
	got, err = srq.Query()
	require.NoError(t, err)
	require.Equal(t, ib.SRQAttr{MaxWR: 5, MaxSGE: 1, Limit: 8}, got)
	require.NoError(t, srq.Modify(nil, 0), "nothing to change")
	require.NoError(t, srq.Destroy())
	require.ErrorIs(t, srq.Modify(&ib.SRQAttr{MaxWR: 8}, ib.SRQMaxWR), ib.ErrDestroyed)
	_, err = srq.Query()
	require.ErrorIs(t, err, ib.ErrDestroyed)
}

// Receives queued on an SRQ survive a grow and a shrink to exactly what
// is queued, in order, and a QP on the SRQ then consumes them over the
// network: SEND i lands in receive i's buffer and completes with its ID,
// as rxe_queue_resize copies the WQEs from the consumer index on. The QP
// takes two first, so the queue has wrapped when it is resized.
func TestSRQResizeKeepsReceivesForTheQP(t *testing.T) {
	a, qa, b, _ := testPair(t)
	srq, qs := srqPeer(t, a, qa, b, 2)
	recv := func(i int) ib.RecvWR { // two SGEs: 16 bytes, then the rest of 256
		return ib.RecvWR{ID: uint64(1000 + i), SGL: []ib.SGE{b.sge(i*256, 16), b.sge(i*256+16, 240)}}
	}
	msg := func(i int) string { return fmt.Sprintf("receive %d, posted %dth, across both SGEs", 1000+i, i) }
	sent := 0
	send := func(k int) { // k SENDs, each into the oldest receive
		for range k {
			i := sent
			sent++
			require.NoError(t, qa.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRSend, Flags: ib.SendSignaled | ib.SendInline,
				Inline: []byte(msg(i))}))
			require.Equal(t, ib.WCSuccess.String(), next(a.cq).Status.String())
			wc := next(b.cq)
			require.Equal(t, ib.WCSuccess.String(), wc.Status.String())
			require.Equal(t, uint64(1000+i), wc.ID, "the oldest receive is taken first")
			require.Equal(t, qs.Num(), wc.QPNum)
			require.Equal(t, msg(i), string(b.buf[i*256:i*256+int(wc.ByteLen)]))
		}
	}
	for i := range 4 {
		require.NoError(t, srq.PostRecv(recv(i)))
	}
	send(2)
	for i := 4; i < 6; i++ { // into the slots 0 and 1 taken: the ring has wrapped
		require.NoError(t, srq.PostRecv(recv(i)))
	}
	requirePostError(t, srq.PostRecv(recv(6)), 0, ib.ErrRecvFull)
	require.NoError(t, srq.Modify(&ib.SRQAttr{MaxWR: 16}, ib.SRQMaxWR))
	for i := 6; i < 10; i++ {
		require.NoError(t, srq.PostRecv(recv(i)))
	}
	const queued = 8 // receives 2..9
	require.ErrorIs(t, srq.Modify(&ib.SRQAttr{MaxWR: queued - 1}, ib.SRQMaxWR), ib.ErrSRQSize)
	require.NoError(t, srq.Modify(&ib.SRQAttr{MaxWR: queued}, ib.SRQMaxWR))
	requirePostError(t, srq.PostRecv(recv(10)), 0, ib.ErrRecvFull)
	got, err := srq.Query()
	require.NoError(t, err)
	require.Equal(t, ib.SRQAttr{MaxWR: queued, MaxSGE: 2}, got)
	require.Equal(t, queued, srq.Len())
	send(queued)
	require.Zero(t, srq.Len())
	got, err = srq.Query()
	require.NoError(t, err)
	require.Equal(t, ib.SRQAttr{MaxWR: queued, MaxSGE: 2}, got)
}

// A QP takes receives, and PostRecv adds them, while the SRQ is resized
// over and over: each SEND completes the next receive posted, in order,
// with its data, and a resize is either done between two of them or
// refused (ErrSRQSize) for the receives queued then. Run under -race.
func TestSRQResizeWhileTheQPReceives(t *testing.T) {
	a, qa, b, _ := testPair(t)
	srq, _ := srqPeer(t, a, qa, b, 1)
	const n, slots = 300, 64 // no size below holds more than slots receives
	taken := make(chan struct{}, 1)
	done := make(chan struct{})
	errs := make(chan error, 2)
	go func() { // the poster, in order; when full it waits for a take
		for i := 0; i < n; {
			err := srq.PostRecv(ib.RecvWR{ID: uint64(i), SGL: []ib.SGE{b.sge(i%slots*256, 256)}})
			switch {
			case err == nil:
				i++
			case errors.Is(err, ib.ErrRecvFull):
				select {
				case <-taken:
				case <-done:
					return
				}
			default:
				errs <- err
				return
			}
		}
	}()
	tick := make(chan struct{}, 1) // a receive completed
	go func() {                    // the resizer, once a completion, until the receives are done
		sizes := []int{1, 8, 2, slots, 3, 16}
		for k := 0; ; k++ {
			select {
			case <-done:
				errs <- nil
				return
			case <-tick:
			}
			if err := srq.Modify(&ib.SRQAttr{MaxWR: sizes[k%len(sizes)]}, ib.SRQMaxWR); err != nil && !errors.Is(err, ib.ErrSRQSize) {
				errs <- err
				return
			}
		}
	}()
	for i := range n {
		m := fmt.Sprintf("message %d", i)
		require.NoError(t, qa.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRSend, Flags: ib.SendSignaled | ib.SendInline, Inline: []byte(m)}))
		wc := next(b.cq)
		require.Equal(t, ib.WCSuccess.String(), wc.Status.String(), "receive %d", i)
		require.Equal(t, uint64(i), wc.ID, "receives are taken in the order posted")
		require.Equal(t, m, string(b.buf[i%slots*256:i%slots*256+int(wc.ByteLen)]))
		for _, c := range []chan struct{}{taken, tick} {
			select {
			case c <- struct{}{}:
			default:
			}
		}
		require.Equal(t, ib.WCSuccess.String(), next(a.cq).Status.String())
	}
	close(done)
	require.NoError(t, <-errs)
}

// srqPeer gives b an SRQ of 4 receives of maxSGE SGEs and an RC QP on it,
// connected to a's qa.
func srqPeer(t *testing.T, a *peer, qa *ib.QP, b *peer, maxSGE int) (*ib.SRQ, *ib.QP) {
	t.Helper()
	srq, err := b.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 4, MaxSGE: maxSGE})
	require.NoError(t, err)
	qs, err := b.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: b.cq, RecvCQ: b.cq, SRQ: srq,
		Cap: ib.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	require.NoError(t, err)
	t.Cleanup(func() { qs.Destroy(); srq.Destroy() })
	connectBoth(a, qa, b, qs)
	return srq, qs
}
