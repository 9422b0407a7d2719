package ib_test

import (
	"context"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// TestResizeCQKeepsOrderAndArm: ibv_resize_cq on a CQ holding completions
// keeps them in order, refuses a size below their number with EINVAL
// changing nothing (rxe_cq_chk_attr: ErrCQSize here), and leaves an arm
// in place: rxe_resize_cq touches only the queue, not cq->notify, so the
// next completion still raises the one event the arm asked for on the
// CQ's completion channel.
func TestResizeCQKeepsOrderAndArm(t *testing.T) {
	p := openPeer(transport.NewMemNetwork(), "10.6.2.1")
	defer p.close()
	ch := p.dev.CreateCompChannel()
	cq, err := p.dev.CreateCQOnChannel(4, ch)
	require.NoError(t, err)
	for id := uint64(1); id <= 3; id++ {
		require.NoError(t, ib.Push(cq, ib.WC{ID: id}))
	}
	require.NoError(t, cq.ReqNotify(false))

	require.ErrorIs(t, cq.Resize(2), ib.ErrCQSize, "below the 3 queued")
	require.Equal(t, 4, cq.Cap(), "a refused resize changes nothing")
	require.NoError(t, cq.Resize(3), "exactly the number queued")
	require.NoError(t, cq.Resize(16))
	require.Equal(t, 16, cq.Cap())

	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = ch.GetCQEvent(done)
	require.ErrorIs(t, err, context.Canceled, "queued completions fire no event, resized or not")
	require.NoError(t, ib.Push(cq, ib.WC{ID: 4}))
	require.NoError(t, ib.Push(cq, ib.WC{ID: 5}))
	got, err := ch.GetCQEvent(context.Background())
	require.NoError(t, err, "the arm did not survive the resize")
	require.Same(t, cq, got)
	_, err = ch.GetCQEvent(done)
	require.ErrorIs(t, err, context.Canceled, "one event per arm")

	var wcs [8]ib.WC
	n := cq.Poll(wcs[:])
	ids := make([]uint64, n)
	for i, wc := range wcs[:n] {
		ids[i] = wc.ID
	}
	require.Equal(t, []uint64{1, 2, 3, 4, 5}, ids)
}
