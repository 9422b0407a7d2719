package transport

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// lentRx is a ReceiveLent caller's slots.
type lentRx struct {
	pkts   [][]byte
	eps    []Endpoint
	leases []*Lease
}

func newLentRx(n int) *lentRx {
	return &lentRx{pkts: make([][]byte, n), eps: make([]Endpoint, n), leases: make([]*Lease, n)}
}

// datagram i of a test: its index and a recognisable filling.
func leaseDatagram(i, size int) []byte {
	d := bytes.Repeat([]byte{byte(i)}, size)
	copy(d, fmt.Sprintf("dgram-%04d", i))
	return d
}

func openLoopUDP(t *testing.T, batch int) (Conn, Conn) {
	t.Helper()
	open := func(a string) Conn {
		c, err := OpenUDP(UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr(a)}, BatchSize: batch, DisableGRO: true})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	return open("127.0.0.1"), open("127.0.0.2")
}

// TestLendUDPHoldsMemoryUntilReleased lends every batch a socket may lend,
// checks that held datagrams keep their bytes while later ones arrive,
// that the next ReceiveLent waits for a release, and that releasing a
// batch's datagrams lets it be reused.
func TestLendUDPHoldsMemoryUntilReleased(t *testing.T) {
	const batch, size = 2, 300
	snd, rcv := openLoopUDP(t, batch)
	l, ok := rcv.(Lender)
	require.True(t, ok, "the UDP Conn lends its receive memory")
	total := batch * (MaxLentBatches + 1)
	for i := range total {
		require.NoError(t, snd.Send([][]byte{leaseDatagram(i, size)}, Endpoint{Remote: rcv.LocalAddrs()[0]}))
	}
	type held struct {
		pkt   []byte
		lease *Lease
		i     int
	}
	var all []held
	rx := newLentRx(batch)
	got := 0
	leases := map[*Lease]bool{}
	for len(leases) < MaxLentBatches {
		n, err := l.ReceiveLent(rx.pkts, rx.eps, rx.leases)
		require.NoError(t, err)
		require.Positive(t, n)
		for k := range n {
			require.Equal(t, leaseDatagram(got, size), rx.pkts[k], "datagram %d", got)
			require.Equal(t, snd.LocalAddrs()[0], rx.eps[k].Remote)
			require.Equal(t, rcv.LocalAddrs()[0], rx.eps[k].Local)
			all = append(all, held{rx.pkts[k], rx.leases[k], got})
			leases[rx.leases[k]] = true
			got++
		}
	}
	// Every batch is lent: the next call waits until one comes back.
	next := make(chan error, 1)
	rx2 := newLentRx(batch)
	var n2 int
	go func() {
		var err error
		n2, err = l.ReceiveLent(rx2.pkts, rx2.eps, rx2.leases)
		next <- err
	}()
	// Nothing was reused while lent.
	for _, h := range all {
		require.Equal(t, leaseDatagram(h.i, size), h.pkt, "held datagram %d changed", h.i)
	}
	select {
	case err := <-next:
		t.Fatalf("ReceiveLent returned (%v) while all %d batches were lent", err, MaxLentBatches)
	default:
	}
	// Release the first batch's datagrams (all share its lease).
	first := all[0].lease
	for _, h := range all {
		if h.lease == first {
			h.lease.Release()
		}
	}
	require.NoError(t, <-next)
	require.Positive(t, n2)
	require.Same(t, first, rx2.leases[0], "the released batch is the one reused")
	require.Equal(t, leaseDatagram(got, size), rx2.pkts[0])
	for _, h := range all {
		if h.lease != first {
			require.Equal(t, leaseDatagram(h.i, size), h.pkt, "held datagram %d changed", h.i)
		}
	}
}

// TestLendUDPCloseWakesExhaustedReceiver: Close wakes a ReceiveLent that
// waits for lent memory.
func TestLendUDPCloseWakesExhaustedReceiver(t *testing.T) {
	const batch = 1
	snd, rcv := openLoopUDP(t, batch)
	l := rcv.(Lender)
	for i := range MaxLentBatches {
		require.NoError(t, snd.Send([][]byte{leaseDatagram(i, 64)}, Endpoint{Remote: rcv.LocalAddrs()[0]}))
	}
	rx := newLentRx(batch)
	for range MaxLentBatches {
		n, err := l.ReceiveLent(rx.pkts, rx.eps, rx.leases)
		require.NoError(t, err)
		require.Equal(t, 1, n)
	}
	done := make(chan error, 1)
	go func() {
		_, err := l.ReceiveLent(rx.pkts, rx.eps, rx.leases)
		done <- err
	}()
	require.NoError(t, rcv.Close())
	require.ErrorIs(t, <-done, net.ErrClosed)
}

// TestLendAdapter lends datagrams of a Conn without a Lender of its own
// (MemNetwork), one lease per datagram, reusing released buffers.
func TestLendAdapter(t *testing.T) {
	mn := NewMemNetwork()
	a, err := mn.Listen(netip.MustParseAddrPort("10.0.0.1:4791"))
	require.NoError(t, err)
	b, err := mn.Listen(netip.MustParseAddrPort("10.0.0.2:4791"))
	require.NoError(t, err)
	_, own := b.(Lender)
	require.False(t, own, "the test needs a Conn without a Lender")
	l := Lend(b)
	for i := range 5 {
		require.NoError(t, a.Send([][]byte{leaseDatagram(i, 100+i)}, Endpoint{Remote: b.LocalAddrs()[0]}))
	}
	rx := newLentRx(8)
	n, err := l.ReceiveLent(rx.pkts, rx.eps, rx.leases)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	seen := map[*Lease]bool{}
	for i := range n {
		require.Equal(t, leaseDatagram(i, 100+i), rx.pkts[i])
		require.Equal(t, a.LocalAddrs()[0], rx.eps[i].Remote)
		require.False(t, seen[rx.leases[i]], "one lease per datagram")
		seen[rx.leases[i]] = true
	}
	kept := rx.pkts[4]
	for i := range 4 {
		rx.leases[i].Release()
	}
	require.NoError(t, a.Send([][]byte{leaseDatagram(9, 50)}, Endpoint{Remote: b.LocalAddrs()[0]}))
	rx2 := newLentRx(8)
	n, err = l.ReceiveLent(rx2.pkts, rx2.eps, rx2.leases)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, leaseDatagram(9, 50), rx2.pkts[0])
	require.True(t, seen[rx2.leases[0]], "a released buffer is reused")
	require.Equal(t, leaseDatagram(4, 104), kept, "a held datagram is untouched")

	// Bad arguments and Close.
	_, err = l.ReceiveLent(make([][]byte, 2), make([]Endpoint, 1), make([]*Lease, 2))
	require.Error(t, err)
	_, err = l.ReceiveLent(make([][]byte, 2), make([]Endpoint, 2), nil)
	require.Error(t, err)
	require.NoError(t, b.Close())
	_, err = l.ReceiveLent(rx.pkts, rx.eps, rx.leases)
	require.True(t, errors.Is(err, net.ErrClosed), "got %v", err)
}

// TestLeaseOverRelease: releasing a datagram twice is a bug that would let
// live memory be overwritten; it panics instead.
func TestLeaseOverRelease(t *testing.T) {
	var recycled int
	l := &Lease{home: recycleFunc(func() { recycled++ })}
	l.open()
	l.lend(2)
	l.Release()
	l.Release()
	require.Zero(t, recycled)
	l.Release()
	require.Equal(t, 1, recycled)
	require.Panics(t, l.Release)
}

type recycleFunc func()

func (f recycleFunc) recycle() { f() }

// TestLendUDPBadArgs: short eps or leases are refused.
func TestLendUDPBadArgs(t *testing.T) {
	_, rcv := openLoopUDP(t, 4)
	l := rcv.(Lender)
	_, err := l.ReceiveLent(make([][]byte, 2), make([]Endpoint, 1), make([]*Lease, 2))
	require.Error(t, err)
	_, err = l.ReceiveLent(make([][]byte, 2), make([]Endpoint, 2), make([]*Lease, 1))
	require.Error(t, err)
	n, err := l.ReceiveLent(nil, nil, nil)
	require.NoError(t, err)
	require.Zero(t, n)
}

// BenchmarkReceiveLentVsCopy compares ReceiveLent with Receive for 4 KiB
// datagrams over loopback (the copy Receive makes is what lending saves).
func BenchmarkReceiveLentVsCopy(b *testing.B) {
	for _, lent := range []bool{false, true} {
		b.Run(map[bool]string{false: "copy", true: "lent"}[lent], func(b *testing.B) {
			snd, err := OpenUDP(UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
			require.NoError(b, err)
			defer snd.Close()
			rcv, err := OpenUDP(UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}})
			require.NoError(b, err)
			defer rcv.Close()
			const per = 16
			out := make([][]byte, per)
			for i := range out {
				out[i] = make([]byte, 4112)
			}
			to := Endpoint{Remote: rcv.LocalAddrs()[0]}
			bufs := make([][]byte, per)
			for i := range bufs {
				bufs[i] = make([]byte, MaxDatagramSize)
			}
			sizes := make([]int, per)
			rx := newLentRx(per)
			b.SetBytes(per * 4112)
			b.ReportAllocs()
			for b.Loop() {
				require.NoError(b, snd.Send(out, to))
				for got := 0; got < per; {
					if lent {
						n, err := rcv.(Lender).ReceiveLent(rx.pkts, rx.eps, rx.leases)
						if err != nil {
							b.Fatal(err)
						}
						for i := range n {
							rx.leases[i].Release()
						}
						got += n
					} else {
						n, err := rcv.Receive(bufs, sizes, rx.eps)
						if err != nil {
							b.Fatal(err)
						}
						got += n
					}
				}
			}
		})
	}
}
