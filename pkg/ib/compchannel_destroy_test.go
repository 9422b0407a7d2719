package ib_test

import (
	"context"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// TestCompChannelDropsEventsOfADestroyedCQ: an event a CQ fired but
// nobody had read when the CQ was destroyed is dropped from its channel,
// as ib_uverbs_release_ucq frees the CQ's entries of the channel's event
// list: ibv_get_cq_event never returns a destroyed CQ. The events of the
// other CQs on the channel stay, in order. Bug (event audit, session
// HCQ): GetCQEvent returned the destroyed CQ, whose ReqNotify then
// failed, to a loop that re-arms what it is handed.
func TestCompChannelDropsEventsOfADestroyedCQ(t *testing.T) {
	p := openPeer(transport.NewMemNetwork(), "10.6.1.1")
	defer p.close()
	ch := p.dev.CreateCompChannel()
	c1, err := p.dev.CreateCQOnChannel(4, ch)
	require.NoError(t, err)
	c2, err := p.dev.CreateCQOnChannel(4, ch)
	require.NoError(t, err)
	c3, err := p.dev.CreateCQOnChannel(4, ch)
	require.NoError(t, err)
	for i, cq := range []*ib.CQ{c1, c2, c3} {
		require.NoError(t, cq.ReqNotify(false))
		require.NoError(t, ib.Push(cq, ib.WC{ID: uint64(i)}))
	}
	require.NoError(t, c2.Destroy())

	for _, want := range []*ib.CQ{c1, c3} {
		got, err := ch.GetCQEvent(context.Background())
		require.NoError(t, err)
		require.Same(t, want, got, "the destroyed CQ's event was returned")
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = ch.GetCQEvent(done)
	require.ErrorIs(t, err, context.Canceled, "no event is left")
	require.NoError(t, c1.Destroy())
	require.NoError(t, c3.Destroy())
	require.NoError(t, ch.Destroy())
}
