package allreduce

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// silencedConn drops every datagram sent once off is set: the network
// between the ranks goes away without a word.
type silencedConn struct {
	transport.Conn
	off *atomic.Bool
}

func (c *silencedConn) Send(bufs [][]byte, ep transport.Endpoint) error {
	if c.off.Load() {
		return nil
	}
	return c.Conn.Send(bufs, ep)
}

// TestRingCloseWaitsForItsWatchers: Ring.Close returns with no goroutine
// of the ring left, even when its neighbours no longer answer (the DREQs
// of its Close unanswered, so the connections end only when the CM gives
// up on them, a minute later). Bug (goroutine audit, session AG): the two
// goroutines DialRDMA started to watch the connections' Done were not
// joined and waited for that end, outliving Close.
func TestRingCloseWaitsForItsWatchers(t *testing.T) {
	leaks := testenv.SnapshotGoroutines("github.com/rxed/rxed/examples/allreduce")
	var off atomic.Bool
	wrap := func(_ int, c transport.Conn) transport.Conn { return &silencedConn{Conn: c, off: &off} }
	ms, err := Join(context.Background(), 2, rdmaDialerOver(t, transport.NewMemNetwork(), wrap, same(2, 2), same(2, 2), 10*time.Second))
	require.NoError(t, err)
	defer closeAll(ms)
	off.Store(true)
	for _, m := range ms {
		require.NoError(t, m.(*RDMARank).Ring.Close()) // the devices stay open
	}
	leaks.CheckNoneLeft(t)
}
