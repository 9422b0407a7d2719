package roce

import (
	"net/netip"
	"sync"
	"syscall"
	"testing"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// refuseLastConn is a transport whose kernel refuses the last datagram
// of the first batch of several it is given (as a socket refuses one over
// the path MTU) and sends the others, reporting that batch's size on
// refused.
type refuseLastConn struct {
	transport.Conn
	once    sync.Once
	refused chan int
}

func (c *refuseLastConn) Send(bufs [][]byte, ep transport.Endpoint) error {
	var err error
	if len(bufs) > 1 {
		c.once.Do(func() {
			if err = c.Conn.Send(bufs[:len(bufs)-1], ep); err == nil {
				err = &transport.SendError{Refused: 1, Err: syscall.EMSGSIZE}
			}
			c.refused <- len(bufs)
		})
		if err != nil {
			return err
		}
	}
	return c.Conn.Send(bufs, ep)
}

// TestSendErrCountsRefusedPacketsOnly: when the transport sends a batch
// but one datagram of it, send_err counts that one, not the batch.
//
// Bug (the transport's counters, lead's task list): flush added the
// whole batch to send_err whenever Send returned an error, though a
// socket refusing one datagram (EMSGSIZE) sends the others.
func TestSendErrCountsRefusedPacketsOnly(t *testing.T) {
	net := transport.NewMemNetwork()
	a1 := netip.MustParseAddr("10.0.0.1")
	mc, err := net.Listen(netip.AddrPortFrom(a1, transport.RoCEv2Port))
	require.NoError(t, err)
	rc := &refuseLastConn{Conn: mc, refused: make(chan int, 1)}
	a := sideWith(t, Config{Conn: rc, Workers: 1, IBATimerOnly: true}, a1, qp.RC, sideCap)
	b := newSide(t, net, "10.0.0.2", qp.RC)
	connect(t, a, b, qp.MTU1024, 14)

	amr, _ := regMR(t, a, 4096)
	bmr, _ := regMR(t, b, 4096)
	// A WRITE of four packets at MTU 1024, built and sent as one batch.
	_, err = a.e.PostSend(a.q, []qp.SendWR{{ID: 1, Opcode: qp.WRRDMAWrite,
		SGL: []qp.SGE{{Addr: amr.IOVA(), Length: 4096, LKey: amr.LKey()}}, RemoteAddr: bmr.IOVA(), RKey: bmr.RKey()}})
	require.NoError(t, err)
	n := <-rc.refused
	require.Greater(t, n, 1)
	_, err = a.e.QueryQP(a.q) // a round trip through the worker, after its flush
	require.NoError(t, err)
	require.Equal(t, uint64(1), a.e.Counters()["send_err"], "a batch of %d, one refused", n)
}
