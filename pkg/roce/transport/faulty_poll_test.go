package transport

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// pollOnlyLender is a Conn that can be polled whose blocking receive
// never returns a datagram (until Close): what it has queued is found only
// by polling, so a test sees which path took it.
type pollOnlyLender struct {
	*fakeLender
	closed chan struct{}
	once   sync.Once
}

func newPollOnlyLender(t *testing.T, batches ...[][]byte) *pollOnlyLender {
	return &pollOnlyLender{fakeLender: newFakeLender(t, batches...), closed: make(chan struct{})}
}

func (l *pollOnlyLender) PollLent(pkts [][]byte, eps []Endpoint, leases []*Lease) (int, error) {
	l.mu.Lock()
	empty := len(l.batches) == 0
	l.mu.Unlock()
	if empty {
		return 0, nil
	}
	return l.fakeLender.PollLent(pkts, eps, leases)
}

func (l *pollOnlyLender) ReceiveLentLocked([][]byte, []Endpoint, []*Lease, sync.Locker) (int, error) {
	<-l.closed
	return 0, errClosed
}

func (l *pollOnlyLender) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.fakeLender.Close()
}

// TestFaultyQueuedFaultsCanBePolled: a Faulty whose receive faults are
// queued (dup, reorder, delay) over a Conn that can be polled is polled:
// one PollLent takes what the inner Conn received, runs it through the
// injector and lends the result, without the pump; a spinner's Cover
// reaches the inner Conn. Bug (soak, kv bench against kv serve): with any
// queued receive fault (dup=0.00001, delay=1ns) the Faulty could not be
// polled, its pump waited in the netpoller, which a spinning waiter hides
// from the scheduler, and a GET's median went from 10 us to 280 us: every
// round trip waited out the client's spin budget.
func TestFaultyQueuedFaultsCanBePolled(t *testing.T) {
	inner := newPollOnlyLender(t, numbered(0, 3))
	f := NewFaulty(inner, FaultConfig{Direction: DirReceive, Dup: 1, Seed: 1})
	defer f.Close()
	require.NotNil(t, f.rxq, "dup is a queued fault")
	var p Poller = f
	require.True(t, p.CanPoll())
	p.Cover()
	require.Equal(t, 1, inner.covered, "the spinner covers the inner Conn's receiver")
	p.Uncover()
	require.Zero(t, inner.covered)

	pkts, eps, leases := make([][]byte, 8), make([]Endpoint, 8), make([]*Lease, 8)
	n, err := p.PollLent(pkts, eps, leases)
	require.NoError(t, err)
	require.Equal(t, []int{0, 0, 1, 1, 2, 2}, ids(pkts[:n]), "each one twice, in one poll")
	require.Equal(t, inner.from, eps[0])
	for _, l := range leases[:n] {
		l.Release()
	}
	require.Equal(t, int32(1), inner.lease.refs.Load(), "the inner Conn's datagrams released once copied")
	n, err = p.PollLent(pkts, eps, leases)
	require.NoError(t, err)
	require.Zero(t, n, "nothing more")
	_, r := f.FaultStats()
	require.Equal(t, FaultCounts{Seen: 3, Duplicated: 3}, r)
}

// The receive goroutine's ReceiveLentLocked takes the queue's datagrams
// holding the caller's lock, as pollers do, and gives the lock back when
// a poller took them first.
func TestFaultyQueuedReceiveLentLockedHoldsTheLock(t *testing.T) {
	inner := newPollOnlyLender(t, numbered(0, 2))
	f := NewFaulty(inner, FaultConfig{Direction: DirReceive, Delay: 1, Seed: 1})
	defer f.Close()
	// Fed as a poller feeds: delayed 1 ns, the injector's timer queues
	// them, and ReceiveLentLocked waits for that.
	f.lender.(*queuedRx).feed()
	pkts, eps, leases := make([][]byte, 8), make([]Endpoint, 8), make([]*Lease, 8)
	var mu sync.Mutex
	var got []int
	for len(got) < 2 {
		n, err := f.ReceiveLentLocked(pkts, eps, leases, &mu)
		require.NoError(t, err)
		require.False(t, mu.TryLock(), "returned with the lock held")
		got = append(got, ids(pkts[:n])...)
		mu.Unlock()
		for _, l := range leases[:n] {
			l.Release()
		}
	}
	require.Equal(t, []int{0, 1}, got)
}
