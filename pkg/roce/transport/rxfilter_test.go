package transport

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// dropIDs is an RxFilter that drops the datagrams whose id (numbered's
// first four bytes) it lists, and counts its calls and what it saw.
type dropIDs struct {
	mu    sync.Mutex
	drop  map[int]bool
	calls int
	seen  []int
}

func (f *dropIDs) FilterRx(b RxBatch) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return b.Partition(func(d []byte) bool {
		id := int(binary.BigEndian.Uint32(d))
		f.seen = append(f.seen, id)
		return !f.drop[id]
	})
}

func dropping(ids ...int) *dropIDs {
	f := &dropIDs{drop: map[int]bool{}}
	for _, id := range ids {
		f.drop[id] = true
	}
	return f
}

// Partition keeps the datagrams it is told to, in order, at the front: a
// lent batch by swapping (the dropped, with their leases, end up behind),
// a copied one by copying down into the receiver's buffers, which stay in
// place.
func TestRxBatchPartition(t *testing.T) {
	for _, tc := range []struct {
		name string
		drop []int
		kept []int
	}{
		{"all kept", nil, []int{0, 1, 2, 3, 4}},
		{"none kept", []int{0, 1, 2, 3, 4}, nil},
		{"first dropped", []int{0}, []int{1, 2, 3, 4}},
		{"last dropped", []int{4}, []int{0, 1, 2, 3}},
		{"alternate", []int{0, 2, 4}, []int{1, 3}},
		{"middle run", []int{1, 2, 3}, []int{0, 4}},
	} {
		t.Run(tc.name+"/lent", func(t *testing.T) {
			pkts := numbered(0, 5)
			eps := make([]Endpoint, 5)
			leases := make([]*Lease, 5)
			for i := range eps {
				eps[i] = Endpoint{Remote: netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), uint16(100+i))}
				leases[i] = new(Lease)
			}
			origLease := slices.Clone(leases)
			f := dropping(tc.drop...)
			k := f.FilterRx(RxBatch{pkts: pkts, eps: eps, leases: leases})
			require.Equal(t, len(tc.kept), k)
			require.Equal(t, []int{0, 1, 2, 3, 4}, f.seen, "each datagram judged once, in order")
			require.Equal(t, tc.kept, nilIfEmpty(ids(pkts[:k])))
			require.ElementsMatch(t, tc.drop, ids(pkts[k:]), "the dropped behind the kept")
			for i := range pkts {
				id := int(binary.BigEndian.Uint32(pkts[i]))
				require.Equal(t, uint16(100+id), eps[i].Remote.Port(), "endpoint moved with datagram %d", id)
				require.Same(t, origLease[id], leases[i], "lease moved with datagram %d", id)
			}
		})
		t.Run(tc.name+"/copied", func(t *testing.T) {
			bufs := make([][]byte, 5)
			sizes := make([]int, 5)
			eps := make([]Endpoint, 5)
			for i, p := range numbered(0, 5) {
				bufs[i] = make([]byte, 64)
				sizes[i] = copy(bufs[i], p[:8+i]) // sizes differ
				eps[i] = Endpoint{Remote: netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), uint16(100+i))}
			}
			orig := slices.Clone(bufs)
			f := dropping(tc.drop...)
			k := f.FilterRx(RxBatch{pkts: bufs, sizes: sizes, eps: eps})
			require.Equal(t, len(tc.kept), k)
			for i, id := range tc.kept {
				require.Equal(t, id, int(binary.BigEndian.Uint32(bufs[i])))
				require.Equal(t, 8+id, sizes[i], "size of datagram %d", id)
				require.Equal(t, uint16(100+id), eps[i].Remote.Port())
			}
			for i := range bufs {
				require.Same(t, &orig[i][0], &bufs[i][0], "buffer %d stays in place", i)
			}
		})
	}
}

func nilIfEmpty(s []int) []int {
	if len(s) == 0 {
		return nil
	}
	return s
}

// A lent batch passes the filter in one call; the dropped datagrams'
// leases are released (the inner Conn's memory is lent, not copied), and a
// batch dropped entirely makes ReceiveLent wait for the next.
func TestRxFilterConnReceiveLent(t *testing.T) {
	inner := newFakeLender(t, numbered(0, 4), numbered(4, 4))
	f := dropping(0, 1, 2, 3, 5)
	c := NewRxFilterConn(inner, f)
	require.Equal(t, Lender(c), Lend(c))
	pkts, eps, leases := make([][]byte, 8), make([]Endpoint, 8), make([]*Lease, 8)
	n, err := c.ReceiveLent(pkts, eps, leases)
	require.NoError(t, err)
	require.Equal(t, []int{4, 6, 7}, ids(pkts[:n]))
	require.Equal(t, 2, f.calls, "one call per batch")
	require.Same(t, &inner.lease, leases[0])
	require.Equal(t, int32(1+3), inner.lease.refs.Load(), "the 5 dropped released, the 3 kept still lent")
	require.Nil(t, leases[n], "no dangling lease behind the kept")
	for _, l := range leases[:n] {
		l.Release()
	}

	n, err = c.ReceiveLent(pkts, eps, leases)
	require.ErrorIs(t, err, errClosed, "the inner Conn's error passes")
	require.Zero(t, n)
}

// Polling goes through the filter too; ReceiveLentLocked returns with the
// caller's lock held only with datagrams, and lets go of it while it waits
// past a batch dropped entirely.
func TestRxFilterConnPolls(t *testing.T) {
	inner := newFakeLender(t, numbered(0, 3), numbered(3, 2), numbered(5, 3))
	c := NewRxFilterConn(inner, dropping(0, 2, 3, 4))
	var p Poller = c
	require.True(t, p.CanPoll())
	p.Cover()
	require.Equal(t, 1, inner.covered)
	p.Uncover()
	require.Zero(t, inner.covered)

	pkts, eps, leases := make([][]byte, 8), make([]Endpoint, 8), make([]*Lease, 8)
	n, err := p.PollLent(pkts, eps, leases)
	require.NoError(t, err)
	require.Equal(t, []int{1}, ids(pkts[:n]))
	leases[0].Release()

	var mu sync.Mutex
	n, err = p.ReceiveLentLocked(pkts, eps, leases, &mu)
	require.NoError(t, err)
	require.False(t, mu.TryLock(), "returned with the lock held")
	mu.Unlock()
	require.Equal(t, []int{5, 6, 7}, ids(pkts[:n]), "the batch of 3 and 4 was dropped and waited past")
	for _, l := range leases[:n] {
		l.Release()
	}
	require.Equal(t, int32(1), inner.lease.refs.Load())

	_, err = p.ReceiveLentLocked(pkts, eps, leases, &mu)
	require.ErrorIs(t, err, errClosed)
	require.True(t, mu.TryLock(), "unlocked on error")
	mu.Unlock()
}

// Without a filter every datagram passes and the inner Conn's lending is
// the wrapper's; over a Conn that cannot be polled, PollLent finds nothing
// and ReceiveLentLocked is ReceiveLent plus the lock; Receive copies into
// the caller's buffers and filters them.
func TestRxFilterConnOverPlainConns(t *testing.T) {
	inner := newFakeLender(t, numbered(0, 2))
	c := NewRxFilterConn(inner, nil)
	pkts, eps, leases := make([][]byte, 8), make([]Endpoint, 8), make([]*Lease, 8)
	n, err := c.ReceiveLent(pkts, eps, leases)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1}, ids(pkts[:n]))

	mn := NewMemNetwork()
	a, err := mn.Listen(ap("10.0.0.1:1"))
	require.NoError(t, err)
	defer a.Close()
	b, err := mn.Listen(ap("10.0.0.2:1"))
	require.NoError(t, err)
	_, bPolls := b.(Poller)
	require.False(t, bPolls, "the test needs a Conn that cannot be polled")
	f := dropping(0, 2)
	d := NewRxFilterConn(b, f)
	defer d.Close()
	require.False(t, d.CanPoll())
	n, err = d.PollLent(pkts, eps, leases)
	require.NoError(t, err)
	require.Zero(t, n)
	to := Endpoint{Remote: ap("10.0.0.2:1")}

	require.NoError(t, a.Send(numbered(0, 4), to))
	var mu sync.Mutex
	var got []int
	for len(got) < 2 {
		n, err = d.ReceiveLentLocked(pkts, eps, leases, &mu)
		require.NoError(t, err)
		require.False(t, mu.TryLock())
		mu.Unlock()
		got = append(got, ids(pkts[:n])...)
		for _, l := range leases[:n] {
			l.Release()
		}
	}
	require.Equal(t, []int{1, 3}, got)

	require.NoError(t, a.Send(numbered(4, 4), to))
	f.mu.Lock()
	f.drop[4], f.drop[6] = true, true
	f.mu.Unlock()
	bufs, sizes := make([][]byte, 8), make([]int, 8)
	for i := range bufs {
		bufs[i] = make([]byte, MaxDatagramSize)
	}
	got = got[:0]
	for len(got) < 2 {
		n, err = d.Receive(bufs, sizes, eps)
		require.NoError(t, err)
		for i := range n {
			require.Equal(t, 16, sizes[i])
			got = append(got, int(binary.BigEndian.Uint32(bufs[i])))
		}
	}
	require.Equal(t, []int{5, 7}, got)
	require.Equal(t, Endpoint{Local: ap("10.0.0.2:1"), Remote: ap("10.0.0.1:1")}, eps[0])
}

// TestRxBatchPartitionNeverTruncates: a kept datagram copied down over a
// dropped one whose buffer is shorter is dropped, not cut to that
// buffer's length (Receive's buffers may differ in length).
//
// Bug (found by the transport audit, session AF): Partition copied it
// down truncated and reported the truncated size, so a Faulty (or any
// RxFilterConn) returned a cut datagram from Receive.
func TestRxBatchPartitionNeverTruncates(t *testing.T) {
	bufs := [][]byte{make([]byte, 16), make([]byte, 64), make([]byte, 64), make([]byte, 64)}
	sizes := make([]int, len(bufs))
	eps := make([]Endpoint, len(bufs))
	for i, l := range []int{10, 40, 12, 50} {
		sizes[i] = copy(bufs[i], idPayload(i, l))
	}
	f := dropping(0) // the first goes: the 40-byte second does not fit its 16-byte buffer
	k := f.FilterRx(RxBatch{pkts: bufs, sizes: sizes, eps: eps})
	require.Equal(t, []int{0, 1, 2, 3}, f.seen)
	require.Equal(t, 2, k)
	require.Equal(t, 2, int(binary.BigEndian.Uint32(bufs[0])), "the 12-byte third took the first buffer")
	require.Equal(t, 12, sizes[0])
	require.Equal(t, 3, int(binary.BigEndian.Uint32(bufs[1])))
	require.Equal(t, 50, sizes[1])
}
