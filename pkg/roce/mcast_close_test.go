package roce

import (
	"net/netip"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// groupJoinerConn is a Conn that joins groups with a socket of its own, as
// a Linux UDP Conn does (transport's mcast_linux.go): the membership's Conn
// is another MemNetwork Conn, which the engine reads in startGroupLoop.
type groupJoinerConn struct {
	transport.Conn
	group *gatedGroupConn
}

func (c *groupJoinerConn) JoinGroup(group netip.Addr) (*transport.Membership, error) {
	return &transport.Membership{Group: group, Conn: c.group}, nil
}

// gatedGroupConn is a group's Conn that records when its Receive saw the
// close, and holds back a Close made anywhere but inside Engine.Close
// until gate is closed: a goroutine of the engine closing the group's
// socket after Close returned (the bug) cannot win a race against the
// test's look, so the test fails every time without the fix.
type gatedGroupConn struct {
	transport.Conn
	gate     chan struct{}
	received atomic.Bool // a Receive returned the close's error
}

func (g *gatedGroupConn) Receive(bufs [][]byte, sizes []int, eps []transport.Endpoint) (int, error) {
	n, err := g.Conn.Receive(bufs, sizes, eps)
	if err != nil {
		g.received.Store(true)
	}
	return n, err
}

func (g *gatedGroupConn) Close() error {
	buf := make([]byte, 1<<14)
	if !strings.Contains(string(buf[:runtime.Stack(buf, false)]), "roce.(*Engine).Close(") {
		<-g.gate
	}
	return g.Conn.Close()
}

// TestCloseWaitsForTheGroupLoop: when Engine.Close returns, a joined
// group's socket is closed and its receive loop has ended, and no
// goroutine of the engine is left. Bug (goroutine audit, session AG): the
// two goroutines of startGroupLoop were not in Engine.wg; a watcher left
// the group on Engine.closed, so Close returned with the group's socket
// open and its reader running (a capture written, a socket closed, after
// Close).
func TestCloseWaitsForTheGroupLoop(t *testing.T) {
	leaks := testenv.SnapshotGoroutines("github.com/rxed/rxed/pkg/roce")
	net := transport.NewMemNetwork()
	a := netip.MustParseAddr("10.0.0.1")
	main, err := net.Listen(netip.AddrPortFrom(a, transport.RoCEv2Port))
	require.NoError(t, err)
	gnet := transport.NewMemNetwork()
	gc, err := gnet.Listen(netip.AddrPortFrom(netip.MustParseAddr("10.0.0.2"), transport.RoCEv2Port))
	require.NoError(t, err)
	group := &gatedGroupConn{Conn: gc, gate: make(chan struct{})}
	defer close(group.gate) // lets a held-back Close finish (the bug's case)

	e, err := New(Config{Conn: &groupJoinerConn{Conn: main, group: group}, Workers: 2, IBATimerOnly: true})
	require.NoError(t, err)
	pd, err := e.Memory().AllocPD()
	require.NoError(t, err)
	cq, err := qp.NewCQ(16)
	require.NoError(t, err)
	q, err := e.CreateQP(qp.Config{Type: qp.UD, PD: pd, SendCQ: cq, RecvCQ: cq, Cap: sideCap})
	require.NoError(t, err)
	require.NoError(t, e.AttachMcast(q, destroyTestGroup))

	require.NoError(t, e.Close())
	require.True(t, group.received.Load(), "Close returned with the group's receive loop still reading its socket")
	require.ErrorIs(t, e.AttachMcast(q, destroyTestGroup), ErrClosed)
	leaks.CheckNoneLeft(t)
}
