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
	rc := &recordConn{}
	a := netip.MustParseAddr("127.0.0.1")
	e := &Engine{conn: rc, clock: SystemClock{}, log: slog.New(slog.DiscardHandler),
		gids: []netip.Addr{a}, gidPorts: []uint16{transport.RoCEv2Port}, ports: map[netip.Addr]uint16{a: transport.RoCEv2Port}}
	w := newWorker(e, 0)
	av := &qp.AddrVector{DGID: netip.MustParseAddr("127.0.0.2")}
	send := func(op wire.Opcode, syn wire.Syndrome) {
		const n = wire.BTHLen + wire.AETHLen + wire.ICRCLen
		buf := w.TxBuffer()
		clear(buf[:n])
		buf[0] = byte(op)
		if op == wire.RCAck {
			wire.AETH(buf[wire.BTHLen:]).SetSyndrome(syn)
		}
		require.NoError(t, w.Transmit(n, av))
	}
	calls := func() int {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return rc.calls
	}
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
