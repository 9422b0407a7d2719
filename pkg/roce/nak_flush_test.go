package roce

import (
	"log/slog"
	"net/netip"
	"testing"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// A NAK leaves as soon as it is built, with whatever the batch held
// before it; ACKs, RNR NAKs and requests wait for the batch's flush. The
// requester keeps sending until it hears of a gap, and the responder
// drops all of that: a NAK held until a received batch of 64 datagrams
// was handled cost the requester that much more to send again.
func TestNAKLeavesAtOnce(t *testing.T) {
	w, rc := bareWorker()
	send := func(op wire.Opcode, syn wire.Syndrome) { transmitToPeer(t, w, op, syn) }
	calls := rc.callCount
	send(wire.RCAck, wire.ACKSyndrome(31))
	send(wire.RCWriteOnly, 0)
	send(wire.RCAck, wire.RNRSyndrome(1))
	require.Zero(t, calls(), "an ACK, a request and an RNR NAK wait for the flush")
	send(wire.RCAck, wire.NAKSyndrome(wire.NAKPSNSeqErr))
	require.Equal(t, 1, calls(), "the NAK went at once")
	require.Len(t, rc.sent, 4, "with the batch before it")
	require.Zero(t, w.txN)
	send(wire.RCAck, wire.NAKSyndrome(wire.NAKRemoteAccess))
	require.Equal(t, 2, calls(), "any NAK")
	send(wire.RCAck, wire.ACKSyndrome(31))
	require.Equal(t, 2, calls())
	w.flush()
	require.Equal(t, 3, calls())
}

// bareWorker is a worker of an engine that runs no goroutine, sending
// from 127.0.0.1 into a recordConn.
func bareWorker() (*worker, *recordConn) {
	rc := &recordConn{}
	a := netip.MustParseAddr("127.0.0.1")
	e := &Engine{conn: rc, clock: SystemClock{}, log: slog.New(slog.DiscardHandler),
		gids: []netip.Addr{a}, gidPorts: []uint16{transport.RoCEv2Port}, ports: map[netip.Addr]uint16{a: transport.RoCEv2Port}}
	return newWorker(e, 0), rc
}

// transmitToPeer builds a bare packet of opcode op (an ACK with syndrome
// syn) to 127.0.0.2 into w's batch.
func transmitToPeer(t *testing.T, w *worker, op wire.Opcode, syn wire.Syndrome) {
	t.Helper()
	const n = wire.BTHLen + wire.AETHLen + wire.ICRCLen
	buf := w.TxBuffer()
	clear(buf[:n])
	buf[0] = byte(op)
	if op == wire.RCAck {
		wire.AETH(buf[wire.BTHLen:]).SetSyndrome(syn)
	}
	require.NoError(t, w.Transmit(n, &qp.AddrVector{DGID: netip.MustParseAddr("127.0.0.2")}))
}

// callCount is how many sends rc has taken.
func (rc *recordConn) callCount() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.calls
}
