package transport

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMemNetworkDelivery(t *testing.T) {
	mn := NewMemNetwork()
	a, err := mn.Listen(ap("10.0.0.1:4791"))
	require.NoError(t, err)
	b, err := mn.Listen(ap("10.0.0.2:4791"))
	require.NoError(t, err)
	c, err := mn.Listen(ap("[fd00::3]:4791"))
	require.NoError(t, err)
	defer a.Close()
	defer b.Close()
	defer c.Close()

	bufs := [][]byte{payload(1, 10), payload(2, 0), payload(3, 4096)}
	require.NoError(t, a.Send(bufs, Endpoint{Remote: ap("10.0.0.2:4791")}))
	// IPv4-mapped destinations are the same address.
	require.NoError(t, c.Send([][]byte{payload(4, 20)}, Endpoint{Local: ap("[fd00::3]:4791"), Remote: ap("[::ffff:10.0.0.2]:4791")}))

	got := receiveN(t, b, 4, 4096)
	for i, want := range [][]byte{payload(1, 10), payload(2, 0), payload(3, 4096)} {
		require.Equal(t, want, got[i].data, "datagram %d", i)
		require.Equal(t, Endpoint{Local: ap("10.0.0.2:4791"), Remote: ap("10.0.0.1:4791")}, got[i].ep)
	}
	require.Equal(t, payload(4, 20), got[3].data)
	require.Equal(t, ap("[fd00::3]:4791"), got[3].ep.Remote)

	st := b.(StatsReporter).Stats()
	require.Equal(t, uint64(4), st.ReceivedPackets)
	require.Equal(t, uint64(10+0+4096+20), st.ReceivedBytes)
	require.Equal(t, uint64(3), a.(StatsReporter).Stats().SentPackets)
}

func TestMemNetworkErrors(t *testing.T) {
	mn := NewMemNetwork()
	_, err := mn.Listen(ap("0.0.0.0:1"))
	require.Error(t, err)
	_, err = mn.Listen(netip.AddrPort{})
	require.Error(t, err)
	a, err := mn.Listen(ap("10.0.0.1:0"))
	require.NoError(t, err)
	require.Equal(t, uint16(49152), a.LocalAddrs()[0].Port())
	a2, err := mn.Listen(ap("10.0.0.1:0"))
	require.NoError(t, err)
	require.Equal(t, uint16(49153), a2.LocalAddrs()[0].Port())
	_, err = mn.Listen(a.LocalAddrs()[0])
	require.ErrorContains(t, err, "in use")

	require.ErrorIs(t, a.Send([][]byte{{1}}, Endpoint{Local: ap("10.0.0.9:0"), Remote: a2.LocalAddrs()[0]}), ErrNoLocalAddr)
	require.ErrorIs(t, a.Send([][]byte{make([]byte, MaxDatagramSize+1)}, Endpoint{Remote: a2.LocalAddrs()[0]}), ErrTooLarge)
	// No listener: dropped and counted like UDP, not an error.
	require.NoError(t, a.Send([][]byte{{1}, {2}}, Endpoint{Remote: ap("10.0.0.7:9")}))
	require.Equal(t, uint64(2), a.(StatsReporter).Stats().DropNoRoute)

	_, err = a.Receive(make([][]byte, 2), make([]int, 1), make([]Endpoint, 2))
	require.Error(t, err)

	// Oversize for the caller's buffer: dropped, counted, the next one is delivered.
	require.NoError(t, a2.Send([][]byte{make([]byte, 100), {7}}, Endpoint{Remote: a.LocalAddrs()[0]}))
	r := newRxSet(4, 50)
	g := guardReceives(t, a)
	n, err := a.Receive(r.bufs, r.sizes, r.eps)
	g.noError(t, err, "waiting for the datagram after the oversize one")
	require.True(t, g.stop())
	require.Equal(t, 1, n)
	require.Equal(t, []byte{7}, r.bufs[0][:r.sizes[0]])
	require.Equal(t, uint64(1), a.(StatsReporter).Stats().DropOversize)

	require.NoError(t, a.Close())
	require.ErrorIs(t, a.Close(), net.ErrClosed)
	require.ErrorIs(t, a.Send([][]byte{{1}}, Endpoint{Remote: a2.LocalAddrs()[0]}), net.ErrClosed)
	// The address is free again.
	a3, err := mn.Listen(a.LocalAddrs()[0])
	require.NoError(t, err)
	a3.Close()
	a2.Close()
}

func TestMemNetworkQueueFull(t *testing.T) {
	mn := NewMemNetwork()
	mn.QueueLen = 3
	a, _ := mn.Listen(ap("10.0.0.1:1"))
	b, _ := mn.Listen(ap("10.0.0.2:1"))
	defer a.Close()
	defer b.Close()
	var bufs [][]byte
	for i := range 5 {
		bufs = append(bufs, payload(i, 8))
	}
	require.NoError(t, a.Send(bufs, Endpoint{Remote: ap("10.0.0.2:1")}))
	got := receiveN(t, b, 3, 64)
	for i := range 3 {
		require.Equal(t, payload(i, 8), got[i].data)
	}
	require.Equal(t, uint64(2), b.(StatsReporter).Stats().DropQueueFull)
	// Small caller batches drain the queue in order across calls.
	require.NoError(t, a.Send(bufs[:3], Endpoint{Remote: ap("10.0.0.2:1")}))
	r := newRxSet(1, 64)
	g := guardReceives(t, b)
	for i := range 3 {
		n, err := b.Receive(r.bufs, r.sizes, r.eps)
		g.noError(t, err, fmt.Sprintf("waiting for datagram %d of 3 in batches of 1", i+1))
		require.Equal(t, 1, n)
		require.Equal(t, payload(i, 8), r.bufs[0][:r.sizes[0]])
	}
}

func TestMemCloseUnblocksReceive(t *testing.T) {
	mn := NewMemNetwork()
	a, _ := mn.Listen(ap("10.0.0.1:1"))
	testCloseUnblocks(t, a)
}

// testCloseUnblocks checks that a Receive blocked before Close returns
// net.ErrClosed, and that later calls do too.
func testCloseUnblocks(t *testing.T, c Conn) {
	t.Helper()
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		r := newRxSet(4, 64)
		close(started)
		_, err := c.Receive(r.bufs, r.sizes, r.eps)
		done <- err
	}()
	<-started
	require.NoError(t, c.Close())
	err := <-done
	require.True(t, errors.Is(err, net.ErrClosed), "got %v", err)
	r := newRxSet(1, 64)
	_, err = c.Receive(r.bufs, r.sizes, r.eps)
	require.ErrorIs(t, err, net.ErrClosed)
}

func TestMemNetworkZeroAllocs(t *testing.T) {
	mn := NewMemNetwork()
	mn.QueueLen = 32 // every slot's buffer is grown by the warm-up round
	a, _ := mn.Listen(ap("10.0.0.1:1"))
	b, _ := mn.Listen(ap("10.0.0.2:1"))
	defer a.Close()
	defer b.Close()
	bufs := make([][]byte, 16)
	for i := range bufs {
		bufs[i] = payload(i, 1024)
	}
	r := newRxSet(16, 2048)
	ep := Endpoint{Remote: ap("10.0.0.2:1")}
	g := guardReceives(t, b)
	round := func() {
		if err := a.Send(bufs, ep); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < len(bufs); {
			n, err := b.Receive(r.bufs, r.sizes, r.eps)
			g.noError(t, err, "zero-allocation round")
			got += n
			g.progress()
		}
	}
	round()
	round()
	require.Zero(t, testing.AllocsPerRun(100, round))
}
