package conform

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/wire"
)

// TestServeForRunsOnTheLinksClock: ServeFor serves for d of the link's
// time: against a fake clock it returns once the clock has moved past d
// (an hour here, taken in one step), however little real time passed.
// Conformance follow-up item 4: ServeFor, waitPeerMessages, topUp's wait
// for a round trip and Q-ACK-COALESCE's window measured real time, so a
// test could not drive them.
func TestServeForRunsOnTheLinksClock(t *testing.T) {
	clk := newFakeClock()
	c, pc, _ := fakeRequesterConn(t, clk, 0x500)
	t.Cleanup(func() {
		clk.close()
		_ = pc.Close()
		_ = c.Link.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.ServeFor(ctx, time.Hour)
	}()
	waitArmed(t, clk)
	clk.Advance(time.Hour)
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("ServeFor did not end when the link's clock passed its hour")
	}
	require.NoError(t, ctx.Err())
}

// TestWaitPeerMessagesRunsOnTheLinksClock: waitPeerMessages gives up when
// the link's clock passes its window, and returns at once when the
// peer's message arrives (the link wakes it, nothing polls).
func TestWaitPeerMessagesRunsOnTheLinksClock(t *testing.T) {
	clk := newFakeClock()
	c, pc, flow := fakeRequesterConn(t, clk, 0x500)
	t.Cleanup(func() {
		clk.close()
		_ = pc.Close()
		_ = c.Link.Close()
	})
	c.Link.setAutoAck(c.OurQPN, c.PeerQPN, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan bool, 1)
	go func() { got <- c.waitPeerMessages(ctx, 1, time.Hour) }()
	waitArmed(t, clk)
	clk.Advance(time.Hour)
	require.False(t, <-got, "no message within the hour")
	require.NoError(t, ctx.Err(), "ended by the link's clock, not the test's bound")

	h := wire.Headers{Opcode: wire.UDSendOnly, PKey: DefaultPKey, DestQP: c.OurQPN, PSN: 1, QKey: UDQKey, SrcQP: c.PeerQPN}
	b := make([]byte, h.Len(8))
	_, err := h.Encode(b, pattern(8, 1))
	require.NoError(t, err)
	flow.Seal(b)
	go func() { got <- c.waitPeerMessages(ctx, 1, time.Hour) }()
	waitArmed(t, clk)
	_, err = pc.WriteToUDPAddrPort(b, flow.Dst)
	require.NoError(t, err)
	require.True(t, <-got, "the peer's UD SEND is its message")
	require.Equal(t, 1, c.PeerMessages())
}

// waitArmed waits until a timer is armed on clk: the code under test
// waits on the link's clock. A wait on real time arms none: that fails
// after a bound instead of hanging.
func waitArmed(t *testing.T, clk *fakeClock) {
	t.Helper()
	ch := make(chan *fakeTimer, 1)
	go func() { ch <- clk.armed() }() // released by clk.close at the latest
	select {
	case tm := <-ch:
		require.NotNil(t, tm)
	case <-time.After(10 * time.Second):
		t.Fatal("no timer armed on the link's clock: the wait runs on real time")
	}
}
