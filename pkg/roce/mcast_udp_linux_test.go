//go:build linux

package roce

import (
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/internal/netns"
	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// TestCloseLeavesNoGroupSocketOverUDP: over real UDP sockets (a network
// namespace of the test's own, loopback with multicast on), an engine
// whose QP joined a group leaves no goroutine of pkg/roce or its
// transport once Close has returned: the group's socket is closed and its
// reader joined (TestCloseWaitsForTheGroupLoop pins the order with a fake
// Conn; this is the Linux membership's path, mcast_linux.go). Goroutine
// audit, session AG.
func TestCloseLeavesNoGroupSocketOverUDP(t *testing.T) {
	why := netns.Available()
	testenv.Need(t, why == "", "%s", why)
	ns, err := netns.Create(fmt.Sprintf("rxed-rmc-%d", os.Getpid()))
	require.NoError(t, err)
	defer ns.Delete()
	require.NoError(t, ns.LoopbackMulticast())

	leaks := testenv.SnapshotGoroutines("github.com/rxed/rxed/pkg/roce", "github.com/rxed/rxed/pkg/roce/transport")
	var e *Engine
	t.Cleanup(func() {
		if e != nil {
			e.Close() // a failed setup's; a second Close is a no-op
		}
	})
	require.NoError(t, ns.Do(func() error {
		c, err := transport.OpenUDP(transport.UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, Port: transport.RoCEv2Port})
		if err != nil {
			return err
		}
		if e, err = New(Config{Conn: c, Workers: 2, IBATimerOnly: true}); err != nil {
			c.Close()
			return err
		}
		pd, err := e.Memory().AllocPD()
		if err != nil {
			return err
		}
		cq, err := qp.NewCQ(16)
		if err != nil {
			return err
		}
		q, err := e.CreateQP(qp.Config{Type: qp.UD, PD: pd, SendCQ: cq, RecvCQ: cq, Cap: sideCap})
		if err != nil {
			return err
		}
		return e.AttachMcast(q, destroyTestGroup)
	}))
	require.Equal(t, map[netip.Addr]int{destroyTestGroup: 1}, e.McastGroups())
	require.NoError(t, e.Close())
	leaks.CheckNoneLeft(t)
}
