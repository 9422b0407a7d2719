package roce

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rxed/rxed/pkg/roce/transport"
)

// probedPoller wraps a Conn that can be polled and records how it is
// used: it counts the datagrams handed out by a blocking receive and by
// a poll, and, with a log, logs every poll (under name, with the packets
// it took) and every cover decision.
type probedPoller struct {
	transport.Conn
	p                transport.Poller
	name             string
	log              *pollLog // nil: count only
	blocking, polled atomic.Int64
	blockingBatches  atomic.Int64
}

// newProbedPoller wraps c, which must be a transport.Poller.
func newProbedPoller(c transport.Conn, name string, log *pollLog) *probedPoller {
	return &probedPoller{Conn: c, p: c.(transport.Poller), name: name, log: log}
}

func (c *probedPoller) ReceiveLent(pkts [][]byte, eps []transport.Endpoint, leases []*transport.Lease) (int, error) {
	n, err := c.p.ReceiveLent(pkts, eps, leases)
	c.noteBlocking(n)
	return n, err
}

func (c *probedPoller) ReceiveLentLocked(pkts [][]byte, eps []transport.Endpoint, leases []*transport.Lease, mu sync.Locker) (int, error) {
	n, err := c.p.ReceiveLentLocked(pkts, eps, leases, mu)
	c.noteBlocking(n)
	return n, err
}

func (c *probedPoller) noteBlocking(n int) {
	if n > 0 {
		c.blocking.Add(int64(n))
		c.blockingBatches.Add(1)
	}
}

func (c *probedPoller) PollLent(pkts [][]byte, eps []transport.Endpoint, leases []*transport.Lease) (int, error) {
	n, err := c.p.PollLent(pkts, eps, leases)
	c.polled.Add(int64(n))
	c.note("%s poll %d", c.name, n)
	return n, err
}

func (c *probedPoller) Cover()        { c.note("%s cover", c.name); c.p.Cover() }
func (c *probedPoller) Uncover()      { c.note("%s uncover", c.name); c.p.Uncover() }
func (c *probedPoller) CanPoll() bool { return c.p.CanPoll() }

func (c *probedPoller) note(format string, args ...any) {
	if c.log != nil {
		c.log.add(format, args...)
	}
}

// pollLog records, across engines, every poll a spinner made (the engine
// and the packets it took) and every cover decision.
type pollLog struct {
	mu sync.Mutex
	ev []string
}

func (l *pollLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ev = append(l.ev, fmt.Sprintf(format, args...))
}

func (l *pollLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev := l.ev
	l.ev = nil
	return ev
}
