package daemon

import (
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// datagram builds a UDP payload that starts like a RoCE packet: opcode
// and destination QP in the BTH, a RETH DMA length, n bytes in all.
func datagram(op wire.Opcode, qpn uint32, dmaLen uint32, n int) []byte {
	b := make([]byte, max(n, wire.BTHLen+wire.RETHLen))
	bth := wire.BTH(b)
	bth.SetOpcode(op)
	b[5], b[6], b[7] = byte(qpn>>16), byte(qpn>>8), byte(qpn)
	wire.RETH(b[wire.BTHLen:]).SetDMALen(dmaLen)
	return b
}

func memPair(t *testing.T) (a, b transport.Conn, aAddr, bAddr netip.AddrPort) {
	t.Helper()
	n := transport.NewMemNetwork()
	aAddr, bAddr = netip.MustParseAddrPort("127.0.0.1:4791"), netip.MustParseAddrPort("127.0.0.2:4791")
	a, err := n.Listen(aAddr)
	require.NoError(t, err)
	b, err = n.Listen(bAddr)
	require.NoError(t, err)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b, aAddr, bAddr
}

// TestTrafficConnSendBudget: datagrams to a tracked peer QP stop at the
// session's budget (counted); other destinations are not affected.
func TestTrafficConnSendBudget(t *testing.T) {
	inner, peer, local, remote := memPair(t)
	tc := newTrafficConn(inner, time.Now)
	st := &sessionTraffic{}
	st.txLimit.Store(3 * 100)
	require.NoError(t, tc.track(st, 0x11, remote.Addr(), 0x22))
	ep := transport.Endpoint{Local: local, Remote: remote}
	for range 10 {
		require.NoError(t, tc.Send([][]byte{datagram(wire.RCReadResponseOnly, 0x22, 0, 100), datagram(wire.RCAck, 0x33, 0, 50)}, ep))
	}
	require.Equal(t, int64(300), st.txBytes.Load())
	require.Equal(t, uint64(7), st.drops.Load())
	require.Equal(t, uint64(7), tc.budgetDrops.Load())
	// What arrived: 3 tracked + 10 untracked.
	bufs := make([][]byte, 32)
	for i := range bufs {
		bufs[i] = make([]byte, 2048)
	}
	sizes, eps := make([]int, 32), make([]transport.Endpoint, 32)
	got := 0
	for got < 13 {
		n, err := peer.Receive(bufs, sizes, eps)
		require.NoError(t, err)
		got += n
	}
	require.Equal(t, 13, got)

	// A gather send is held to the same budget.
	require.NoError(t, tc.SendGather([]transport.Gather{{datagram(wire.RCReadResponseOnly, 0x22, 0, 100)}}, ep))
	require.Equal(t, uint64(8), st.drops.Load())
	tc.untrack(st, 0x11, remote.Addr(), 0x22)
	require.NoError(t, tc.Send([][]byte{datagram(wire.RCReadResponseOnly, 0x22, 0, 100)}, ep))
	require.Equal(t, uint64(8), st.drops.Load(), "untracked: no budget")
}

// TestTrafficConnReceive: a datagram for a tracked QP refreshes its idle
// clock; a READ request longer than the session's cap never reaches the
// engine (lent or copied receive alike).
func TestTrafficConnReceive(t *testing.T) {
	inner, peer, local, remote := memPair(t)
	now := time.Unix(1000, 0)
	tc := newTrafficConn(inner, func() time.Time { return now })
	st := &sessionTraffic{maxRead: 4096}
	require.NoError(t, tc.track(st, 0x11, remote.Addr(), 0x22))
	ep := transport.Endpoint{Local: remote, Remote: local}
	require.NoError(t, peer.Send([][]byte{
		datagram(wire.RCReadRequest, 0x11, 1<<20, 28), // over the cap
		datagram(wire.RCReadRequest, 0x11, 4096, 28),  // at the cap
		datagram(wire.RCReadRequest, 0x99, 1<<20, 28), // another QP: no cap
	}, ep))
	pkts, eps, leases := make([][]byte, 8), make([]transport.Endpoint, 8), make([]*transport.Lease, 8)
	got := 0
	var lens []uint32
	for got < 2 {
		n, err := tc.ReceiveLent(pkts, eps, leases)
		require.NoError(t, err)
		for i := range n {
			lens = append(lens, wire.RETH(pkts[i][wire.BTHLen:]).DMALen())
			leases[i].Release()
		}
		got += n
	}
	require.Equal(t, []uint32{4096, 1 << 20}, lens)
	require.Equal(t, uint64(1), tc.readCapDrops.Load())
	require.Equal(t, now.UnixNano(), st.lastRx.Load())
	require.Equal(t, int64(56), st.rxBytes.Load())

	// The copying Receive drops the same way.
	now = now.Add(time.Second)
	require.NoError(t, peer.Send([][]byte{datagram(wire.RCReadRequest, 0x11, 1<<20, 28), datagram(wire.RCWriteOnly, 0x11, 8, 64)}, ep))
	bufs := [][]byte{make([]byte, 2048), make([]byte, 2048)}
	sizes, reps := make([]int, 2), make([]transport.Endpoint, 2)
	n, err := tc.Receive(bufs, sizes, reps)
	require.NoError(t, err)
	if n == 0 || wire.BTH(bufs[0]).Opcode() != wire.RCWriteOnly {
		n, err = tc.Receive(bufs, sizes, reps)
		require.NoError(t, err)
	}
	require.Equal(t, 1, n)
	require.Equal(t, wire.RCWriteOnly, wire.BTH(bufs[0][:sizes[0]]).Opcode())
	require.Equal(t, uint64(2), tc.readCapDrops.Load())
	require.Equal(t, now.UnixNano(), st.lastRx.Load())
}

// mtuConn is an inner Conn on a path of MTU mtu: like a socket's kernel
// it refuses a datagram longer than that (EMSGSIZE), sends the others
// and names the refused (transport.SendError).
type mtuConn struct {
	transport.Conn
	mtu int
}

func (c *mtuConn) Send(bufs [][]byte, ep transport.Endpoint) error {
	var fit [][]byte
	var refused []int
	for i, b := range bufs {
		if len(b) > c.mtu {
			refused = append(refused, i)
			continue
		}
		fit = append(fit, b)
	}
	if err := c.Conn.Send(fit, ep); err != nil {
		return err
	}
	if len(refused) == 0 {
		return nil
	}
	return &transport.SendError{Refused: len(refused), Index: refused, Err: syscall.EMSGSIZE}
}

// TestTrafficConnRefundsRefusedDatagrams: a datagram the socket refused
// (over the path MTU) never left the host, so it neither counts in a
// session's sent bytes nor uses up its budget, which bounds the bytes
// its peer is sent (anti-amplification, --session-bytes); a send that
// failed whole gives back all. The error names the refused datagrams at
// the caller's positions also when the budget kept some back.
//
// Bug (follow-up item 3 of the transport's counters): allowTx charged
// every datagram before the send and nothing gave back the refused ones,
// so a session whose large packets the path refused ran out of budget
// (and reported bytes as sent) without a byte of them on the wire.
func TestTrafficConnRefundsRefusedDatagrams(t *testing.T) {
	a, peer, local, remote := memPair(t)
	tc := newTrafficConn(&mtuConn{Conn: a, mtu: 1000}, time.Now)
	st := &sessionTraffic{}
	st.txLimit.Store(4000)
	require.NoError(t, tc.track(st, 0x11, remote.Addr(), 0x22))
	ep := transport.Endpoint{Local: local, Remote: remote}

	err := tc.Send([][]byte{datagram(wire.RCReadResponseOnly, 0x22, 0, 100), datagram(wire.RCReadResponseOnly, 0x22, 0, 2000),
		datagram(wire.RCReadResponseOnly, 0x22, 0, 100)}, ep)
	require.ErrorIs(t, err, syscall.EMSGSIZE)
	require.Equal(t, int64(200), st.txBytes.Load(), "the refused 2000 bytes are not sent bytes")
	err = tc.SendGather([]transport.Gather{{datagram(wire.RCReadResponseOnly, 0x22, 0, 3000)}}, ep)
	require.ErrorIs(t, err, syscall.EMSGSIZE)
	require.Equal(t, int64(200), st.txBytes.Load(), "nor through SendGather")
	// A send that fails whole (no such local address) sent nothing.
	require.Error(t, tc.Send([][]byte{datagram(wire.RCReadResponseOnly, 0x22, 0, 100)},
		transport.Endpoint{Local: netip.MustParseAddrPort("127.9.9.9:4791"), Remote: remote}))
	require.Equal(t, int64(200), st.txBytes.Load())

	// The budget left is what the refused did not use: 3800 bytes more go.
	for range 4 {
		require.NoError(t, tc.Send([][]byte{datagram(wire.RCReadResponseOnly, 0x22, 0, 950)}, ep))
	}
	require.Equal(t, int64(4000), st.txBytes.Load())
	require.Zero(t, st.drops.Load())
	require.Equal(t, 6, receiveAll(t, peer, 6))

	// With the budget spent, the refused datagrams' positions are still
	// the caller's: 1 and 3 of [tracked 100 (over budget), untracked
	// 2000, tracked 100 (over budget), untracked 2000, untracked 100].
	err = tc.Send([][]byte{datagram(wire.RCReadResponseOnly, 0x22, 0, 100), datagram(wire.RCAck, 0x33, 0, 2000),
		datagram(wire.RCReadResponseOnly, 0x22, 0, 100), datagram(wire.RCAck, 0x33, 0, 2000), datagram(wire.RCAck, 0x33, 0, 100)}, ep)
	require.Equal(t, 2, transport.Refused(err, 5))
	idx, known := transport.RefusedIndex(err)
	require.True(t, known)
	require.Equal(t, []int{1, 3}, idx)
	require.Equal(t, uint64(2), st.drops.Load())
	require.Equal(t, int64(4000), st.txBytes.Load())
}

// receiveAll receives n datagrams from c.
func receiveAll(t *testing.T, c transport.Conn, n int) int {
	t.Helper()
	bufs := make([][]byte, 32)
	for i := range bufs {
		bufs[i] = make([]byte, 4096)
	}
	sizes, eps := make([]int, 32), make([]transport.Endpoint, 32)
	got := 0
	for got < n {
		k, err := c.Receive(bufs, sizes, eps)
		require.NoError(t, err)
		got += k
	}
	return got
}
