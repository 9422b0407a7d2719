package allreduce

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// cmDropConn drops the first CM MAD its engine sends that match accepts.
type cmDropConn struct {
	transport.Conn
	match func(mad.Message) bool

	mu      sync.Mutex
	dropped int
}

func (c *cmDropConn) Send(bufs [][]byte, ep transport.Endpoint) error {
	c.mu.Lock()
	keep := make([][]byte, 0, len(bufs))
	for _, b := range bufs {
		if c.dropped == 0 && c.isMatch(b) {
			c.dropped++
			continue
		}
		keep = append(keep, b)
	}
	c.mu.Unlock()
	if len(keep) == 0 {
		return nil
	}
	return c.Conn.Send(keep, ep)
}

func (c *cmDropConn) isMatch(b []byte) bool {
	var p wire.Packet
	if p.Parse(b) != nil || p.BTH.DestQP() != 1 {
		return false
	}
	_, m, err := mad.Parse(p.Payload)
	return err == nil && c.match(m)
}

func (c *cmDropConn) drops() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropped
}

// TestRingFormsWhenAGivenUpAttemptsREJIsLost: rank 1's REP to rank 0 is
// lost, so rank 0's Dial attempt times out (1 s) and it sends a REJ
// (timeout) for it, which is lost too; rank 0 then dials again. Rank 1
// must serve that new REQ: it waited instead in the Accept of the given-up
// attempt for an RTU that never came, and the ring never formed (the
// eight-host ring with 2% loss on one link, about one run in 50: both
// neighbours gave up after a minute).
func TestRingFormsWhenAGivenUpAttemptsREJIsLost(t *testing.T) {
	const n, count = 3, 1000
	conns := map[int]*cmDropConn{
		0: {match: func(m mad.Message) bool { r, ok := m.(*mad.REJ); return ok && r.Reason == mad.REJTimeout }},
		1: {match: func(m mad.Message) bool { _, ok := m.(*mad.REP); return ok }},
	}
	wrap := func(rank int, c transport.Conn) transport.Conn {
		if d := conns[rank]; d != nil {
			d.Conn = c
			return d
		}
		return c
	}
	ctx := context.Background()
	ms, err := Join(ctx, n, rdmaDialerOver(t, transport.NewMemNetwork(), wrap, same(n, n), same(n, count), 10*time.Second))
	require.NoError(t, err)
	defer closeAll(ms)
	require.Equal(t, 1, conns[1].drops(), "rank 1's first REP was lost")
	require.Equal(t, 1, conns[0].drops(), "rank 0 gave its first attempt up and its REJ was lost")
	_, errs := Run(ctx, ms)
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Zero(t, Check(ms))
}
