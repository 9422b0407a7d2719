package rdmacm_test

import (
	"net/netip"
	"sync"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// openMemHost opens a host at address s of net; with tap not nil, the
// device's transport goes through it.
func openMemHost(t *testing.T, net *transport.MemNetwork, s string, tap *madTap) *host {
	t.Helper()
	a := netip.MustParseAddr(s)
	c, err := net.Listen(netip.AddrPortFrom(a, transport.RoCEv2Port))
	require.NoError(t, err)
	cfg := ib.Config{Conn: c}
	if tap != nil {
		cfg.Wrap = func(c transport.Conn) (transport.Conn, error) { tap.Conn = c; return tap, nil }
	}
	return openHost(t, cfg, a)
}

// madTap is a device's transport (ib.Config.Wrap) that records the CM
// MADs the device sends and may hold some back: a held datagram does not
// leave until release sends it, so a test loses a MAD, or delays it past
// what it caused, by an event instead of a timer.
type madTap struct {
	transport.Conn

	mu   sync.Mutex
	sent []mad.Message // CM messages sent (held ones too), in order
	// sentEP are their endpoints (sentEP[i] sent[i]'s: IP TOS and TTL).
	sentEP []transport.Endpoint
	// hold, when set, decides whether a CM message is held back.
	hold   func(mad.Message) bool
	held   [][]byte
	heldEP []transport.Endpoint
	// dataEP are the endpoints the other datagrams left with, in order
	// (their IP TOS and TTL among them).
	dataEP []transport.Endpoint
}

// ReportTraffic passes the engine's request on (transport.TrafficReporter),
// so that a tapped device's QPs learn received traffic as an untapped
// one's do (QP 1 the traffic class its answers may take).
func (c *madTap) ReportTraffic(on bool) error {
	if r, ok := c.Conn.(transport.TrafficReporter); ok {
		return r.ReportTraffic(on)
	}
	return nil
}

func (c *madTap) Send(bufs [][]byte, ep transport.Endpoint) error {
	out := make([][]byte, 0, len(bufs))
	c.mu.Lock()
	for _, b := range bufs {
		if m := cmMessage(b); m != nil {
			c.sent = append(c.sent, m)
			c.sentEP = append(c.sentEP, ep)
			if c.hold != nil && c.hold(m) {
				c.held = append(c.held, append([]byte(nil), b...))
				c.heldEP = append(c.heldEP, ep)
				continue
			}
		} else {
			c.dataEP = append(c.dataEP, ep)
		}
		out = append(out, b)
	}
	c.mu.Unlock()
	if len(out) == 0 {
		return nil
	}
	return c.Conn.Send(out, ep)
}

// messages returns the CM messages sent so far.
func (c *madTap) messages() []mad.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]mad.Message(nil), c.sent...)
}

// messageEndpoints returns the endpoints of the CM messages sent so far,
// as messages lists them.
func (c *madTap) messageEndpoints() []transport.Endpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]transport.Endpoint(nil), c.sentEP...)
}

// dataEndpoints returns the endpoints of the datagrams other than CM
// MADs sent so far.
func (c *madTap) dataEndpoints() []transport.Endpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]transport.Endpoint(nil), c.dataEP...)
}

// heldCount is how many datagrams are held back.
func (c *madTap) heldCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.held)
}

// release sends the held datagrams and holds nothing more.
func (c *madTap) release() error {
	c.mu.Lock()
	held, eps := c.held, c.heldEP
	c.held, c.heldEP, c.hold = nil, nil, nil
	c.mu.Unlock()
	for i, b := range held {
		if err := c.Conn.Send([][]byte{b}, eps[i]); err != nil {
			return err
		}
	}
	return nil
}

// cmMessage parses a RoCE datagram that is a CM MAD (a UD SEND_ONLY to QP
// 1); nil for anything else.
func cmMessage(b []byte) mad.Message {
	const hdr = wire.BTHLen + wire.DETHLen
	if len(b) < hdr+mad.MADLen {
		return nil
	}
	bth := wire.BTH(b)
	if bth.Opcode() != wire.UDSendOnly || bth.DestQP() != 1 {
		return nil
	}
	_, m, err := mad.Parse(b[hdr : hdr+mad.MADLen])
	if err != nil {
		return nil
	}
	return m
}
