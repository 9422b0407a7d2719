package roce

import (
	"net/netip"
	"sync"
	"testing"

	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// closeOrderConn records when its Conn was closed and when the engine
// waited for its sockets.
type closeOrderConn struct {
	transport.Conn
	mu    sync.Mutex
	order []string
}

func (c *closeOrderConn) Close() error {
	c.mu.Lock()
	c.order = append(c.order, "close")
	c.mu.Unlock()
	return c.Conn.Close()
}

func (c *closeOrderConn) WaitClosed() {
	c.mu.Lock()
	c.order = append(c.order, "wait")
	c.mu.Unlock()
}

// TestEngineCloseWaitsForItsSockets: Engine.Close returns only after the
// Conn's sockets are closed (transport.CloseWaiter), so that the address
// can be bound again at once. Another engine's poll in flight on the
// socket kept it open past Close, and a device reopened on the address
// failed with "address already in use" (cmd/rxed's TestToolsAgainstNoServer,
// once under -count=3 -shuffle=on; about 1 reopen in 1,000 after an
// rdma_cm reject).
func TestEngineCloseWaitsForItsSockets(t *testing.T) {
	inner, err := transport.NewMemNetwork().Listen(netip.MustParseAddrPort("10.0.0.1:4791"))
	require.NoError(t, err)
	c := &closeOrderConn{Conn: inner}
	e, err := New(Config{Conn: c, Workers: 1})
	require.NoError(t, err)
	require.NoError(t, e.Close())
	require.Equal(t, []string{"close", "wait"}, c.order)
}
