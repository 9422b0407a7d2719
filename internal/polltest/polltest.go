// Package polltest helps tests of receiving by polling
// (transport.Poller, roce.Engine.Progress, ib.CQ.Poll).
package polltest

import (
	"fmt"
	"net"
	"sync"

	"github.com/rxed/rxed/pkg/roce/transport"
)

// Only wraps a Conn that can be polled so that its blocking receive
// never returns a datagram (it waits for Close): an engine over it
// receives only when somebody polls, so a test can tell that polling
// received what arrived.
func Only(c transport.Conn) (transport.Conn, error) {
	p, ok := c.(transport.Poller)
	if !ok || !p.CanPoll() {
		return nil, fmt.Errorf("polltest: %T cannot be polled", c)
	}
	return &pollOnly{Conn: c, p: p, closed: make(chan struct{})}, nil
}

type pollOnly struct {
	transport.Conn
	p      transport.Poller
	closed chan struct{}
	once   sync.Once
}

func (c *pollOnly) ReceiveLent([][]byte, []transport.Endpoint, []*transport.Lease) (int, error) {
	<-c.closed
	return 0, net.ErrClosed
}

func (c *pollOnly) ReceiveLentLocked(pkts [][]byte, eps []transport.Endpoint, leases []*transport.Lease, _ sync.Locker) (int, error) {
	return c.ReceiveLent(pkts, eps, leases)
}

func (c *pollOnly) PollLent(pkts [][]byte, eps []transport.Endpoint, leases []*transport.Lease) (int, error) {
	return c.p.PollLent(pkts, eps, leases)
}

func (c *pollOnly) Cover()   { c.p.Cover() }
func (c *pollOnly) Uncover() { c.p.Uncover() }

func (c *pollOnly) CanPoll() bool { return true }

func (c *pollOnly) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}
