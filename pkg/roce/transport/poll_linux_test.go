package transport

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// pollUntil spins on PollLent until it returns datagrams, an error, or
// receiveTimeout passes (the test then fails saying what it waited for).
func pollUntil(t *testing.T, p Poller, rx *lentRx, what string) int {
	t.Helper()
	deadline := time.Now().Add(receiveTimeout)
	for {
		n, err := p.PollLent(rx.pkts, rx.eps, rx.leases)
		require.NoError(t, err, what)
		if n > 0 {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing polled within %v while waiting for %s", receiveTimeout, what)
		}
		runtime.Gosched()
	}
}

// TestPollLentOneSocket: a one-socket Conn can be polled; an idle poll
// returns nothing at once; queued datagrams come back intact with their
// endpoints; a closed Conn says so.
func TestPollLentOneSocket(t *testing.T) {
	snd, rcv := openLoopUDP(t, 8)
	p, ok := rcv.(Poller)
	require.True(t, ok, "the UDP Conn is a Poller")
	require.True(t, p.CanPoll(), "one socket on Linux can be polled")
	rx := newLentRx(8)
	n, err := p.PollLent(rx.pkts, rx.eps, rx.leases)
	require.NoError(t, err)
	require.Zero(t, n, "nothing was sent yet")

	const count, size = 5, 200
	for i := range count {
		require.NoError(t, snd.Send([][]byte{leaseDatagram(i, size)}, Endpoint{Remote: rcv.LocalAddrs()[0]}))
	}
	for got := 0; got < count; {
		n := pollUntil(t, p, rx, "the datagrams sent")
		for j := range n {
			require.Equal(t, leaseDatagram(got, size), rx.pkts[j], "datagram %d", got)
			require.Equal(t, snd.LocalAddrs()[0], rx.eps[j].Remote)
			require.Equal(t, rcv.LocalAddrs()[0], rx.eps[j].Local)
			rx.leases[j].Release()
			got++
		}
	}
	n, err = p.PollLent(rx.pkts, rx.eps, rx.leases)
	require.NoError(t, err)
	require.Zero(t, n, "everything was taken")

	_, err = p.PollLent(rx.pkts[:2], rx.eps[:1], rx.leases)
	require.Error(t, err, "eps shorter than pkts")
	_, err = p.ReceiveLentLocked(rx.pkts[:2], rx.eps, rx.leases[:1], &sync.Mutex{})
	require.Error(t, err, "leases shorter than pkts")

	require.NoError(t, rcv.Close())
	_, err = p.PollLent(rx.pkts, rx.eps, rx.leases)
	require.ErrorIs(t, err, net.ErrClosed)
}

// TestReceiveLentLockedHoldsTheLock: datagrams come back with the caller's
// lock held, and an error with it released; a receiver blocked waiting
// holds no lock (a poller can take it meanwhile) and Close wakes it.
func TestReceiveLentLockedHoldsTheLock(t *testing.T) {
	snd, rcv := openLoopUDP(t, 8)
	p := rcv.(Poller)
	var mu sync.Mutex
	rx := newLentRx(8)
	require.NoError(t, snd.Send([][]byte{leaseDatagram(1, 64)}, Endpoint{Remote: rcv.LocalAddrs()[0]}))
	n, err := p.ReceiveLentLocked(rx.pkts, rx.eps, rx.leases, &mu)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, leaseDatagram(1, 64), rx.pkts[0])
	require.False(t, mu.TryLock(), "datagrams are returned with the lock held")
	mu.Unlock()
	rx.leases[0].Release()

	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		rx := newLentRx(8)
		n, err := p.ReceiveLentLocked(rx.pkts, rx.eps, rx.leases, &mu)
		done <- result{n, err}
	}()
	// While it waits for a datagram the receiver holds no lock (only for
	// the instant of each attempt): a poller keeps getting the lock, and
	// an empty poll.
	deadline := time.Now().Add(receiveTimeout)
	for got := 0; got < 100; {
		require.False(t, time.Now().After(deadline), "a waiting receiver kept the lock (%d of 100 polls got it)", got)
		if !mu.TryLock() {
			runtime.Gosched()
			continue
		}
		n, err := p.PollLent(rx.pkts, rx.eps, rx.leases)
		mu.Unlock()
		require.NoError(t, err)
		require.Zero(t, n)
		got++
		runtime.Gosched()
	}
	require.NoError(t, rcv.Close())
	r := <-done
	require.ErrorIs(t, r.err, net.ErrClosed)
	require.Zero(t, r.n)
	require.True(t, mu.TryLock(), "an error returns with the lock released")
}

// TestPollAndReceiveKeepArrivalOrder runs a blocking receiver
// (ReceiveLentLocked) and a spinning poller (PollLent under the same
// lock) on one socket while a sender streams numbered datagrams: every
// datagram is seen once, intact, and in the order it was sent, whoever
// took it. Under -race this also checks that the two share the socket's
// receive state only under the locks.
func TestPollAndReceiveKeepArrivalOrder(t *testing.T) {
	const total, window, size = 20000, 64, 96
	snd, rcv := openLoopUDP(t, 16)
	p := rcv.(Poller)
	var (
		mu     sync.Mutex // orders the receivers (the engine's rxMu)
		seen   []uint32   // under mu
		bad    []string   // under mu
		byPoll int        // under mu
		acked  atomic.Int64
	)
	record := func(rx *lentRx, n int, polled bool) {
		for j := range n {
			d := rx.pkts[j]
			if len(d) != size {
				bad = append(bad, "wrong length")
			} else {
				seq := binary.BigEndian.Uint32(d)
				for k := 4; k < size; k++ {
					if d[k] != byte(seq+uint32(k)) {
						bad = append(bad, "corrupt datagram")
						break
					}
				}
				seen = append(seen, seq)
			}
			rx.leases[j].Release()
			if polled {
				byPoll++
			}
		}
		acked.Add(int64(n))
	}
	var wg sync.WaitGroup
	var stop atomic.Bool
	wg.Add(2)
	go func() { // the engine's receive loop
		defer wg.Done()
		rx := newLentRx(16)
		for {
			n, err := p.ReceiveLentLocked(rx.pkts, rx.eps, rx.leases, &mu)
			if err != nil {
				return
			}
			record(rx, n, false)
			mu.Unlock()
		}
	}()
	go func() { // an application spinning on its CQ
		defer wg.Done()
		rx := newLentRx(16)
		for !stop.Load() {
			if mu.TryLock() {
				n, err := p.PollLent(rx.pkts, rx.eps, rx.leases)
				if err == nil {
					record(rx, n, true)
				}
				mu.Unlock()
			}
			runtime.Gosched()
		}
	}()
	dst := Endpoint{Remote: rcv.LocalAddrs()[0]}
	deadline := time.Now().Add(30 * time.Second)
	batch := make([][]byte, 4)
	for sent := 0; sent < total; {
		// A window of datagrams in flight keeps the socket buffer from
		// overflowing: loss would make the test prove nothing.
		for int64(sent)-acked.Load() >= window {
			require.False(t, time.Now().After(deadline), "receivers stalled at %d of %d", acked.Load(), sent)
			runtime.Gosched()
		}
		k := min(len(batch), total-sent)
		for i := range k {
			d := make([]byte, size)
			seq := uint32(sent + i)
			binary.BigEndian.PutUint32(d, seq)
			for j := 4; j < size; j++ {
				d[j] = byte(seq + uint32(j))
			}
			batch[i] = d
		}
		require.NoError(t, snd.Send(batch[:k], dst))
		sent += k
	}
	for acked.Load() < total {
		require.False(t, time.Now().After(deadline), "received %d of %d", acked.Load(), total)
		runtime.Gosched()
	}
	stop.Store(true)
	require.NoError(t, rcv.Close())
	wg.Wait()
	require.Empty(t, bad)
	require.Len(t, seen, total)
	for i, s := range seen {
		if s != uint32(i) {
			t.Fatalf("datagram %d arrived as number %d: order not kept across receivers", s, i)
		}
	}
	t.Logf("%d of %d datagrams taken by the poller", byPoll, total)
}

// TestPollTwoSockets: with two sockets per-socket reader goroutines
// receive, so the Conn does not offer polling; ReceiveLentLocked still
// returns with the lock held.
func TestPollTwoSockets(t *testing.T) {
	c, err := OpenUDP(UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	snd, _ := openLoopUDP(t, 8)
	p := c.(Poller)
	require.False(t, p.CanPoll())
	require.NoError(t, snd.Send([][]byte{leaseDatagram(3, 50)}, Endpoint{Remote: c.LocalAddrs()[1]}))
	var mu sync.Mutex
	rx := newLentRx(4)
	n, err := p.ReceiveLentLocked(rx.pkts, rx.eps, rx.leases, &mu)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, leaseDatagram(3, 50), rx.pkts[0])
	require.Equal(t, c.LocalAddrs()[1], rx.eps[0].Local)
	require.False(t, mu.TryLock())
	mu.Unlock()
	rx.leases[0].Release()
	n, err = p.PollLent(rx.pkts, rx.eps, rx.leases)
	require.NoError(t, err)
	require.Zero(t, n)
	require.NoError(t, c.Close())
	_, err = p.ReceiveLentLocked(rx.pkts, rx.eps, rx.leases, &mu)
	require.True(t, errors.Is(err, net.ErrClosed), "got %v", err)
	require.True(t, mu.TryLock(), "an error returns with the lock released")
}
