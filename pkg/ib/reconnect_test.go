package ib_test

import (
	"net/netip"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// firstSent returns the first datagram c sent with opcode op.
func firstSent(t *testing.T, c *tapConn, op wire.Opcode) []byte {
	t.Helper()
	sent := c.packets()
	for _, b := range sent {
		if len(b) > 0 && wire.Opcode(b[0]) == op {
			return b
		}
	}
	t.Fatalf("no %v among the %d datagrams sent", op, len(sent))
	return nil
}

// TestReconnectTakesTheOldConnectionsResendForADuplicate: a pair
// recovered after a remote access error (RESET, then connectBoth) meets
// the refused WRITE once more, as the old requester's resend, sent before
// the NAK came back, would arrive. The new connection starts from new
// PSNs, so the responder counts the stray as a duplicate, stays in RTS,
// and the next WRITE succeeds. From the old PSNs it was the new
// connection's first request: refused again, the responder in ERR, and
// the test's next WRITE failed (TestFastRegLifecycle once under -cpu 4
// and load, with RETRY_EXC_ERR; the access matrix before it, fc81544).
func TestReconnectTakesTheOldConnectionsResendForADuplicate(t *testing.T) {
	net := transport.NewMemNetwork()
	aAddr := netip.MustParseAddr("10.9.1.1")
	conn, err := net.Listen(netip.AddrPortFrom(aAddr, transport.RoCEv2Port))
	require.NoError(t, err)
	tap := &tapConn{Conn: conn}
	a, b := openPeerOn(tap, aAddr), openPeer(net, "10.9.1.2")
	t.Cleanup(func() { a.close(); b.close() })
	qa, qb := a.createQP(ib.RC), b.createQP(ib.RC)
	connectBoth(a, qa, b, qb)

	copy(a.buf, "stale!!!")
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey() ^ 0x80}))
	requireWC(t, a, 1, ib.WCRemAccessErr)
	refused := firstSent(t, tap, wire.RCWriteOnly)
	for _, q := range []*ib.QP{qa, qb} {
		require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
	}
	connectBoth(a, qa, b, qb)

	dups := b.dev.Counters()["duplicate_request"]
	// The stray goes first: b's queue is first in, first out, and a's
	// engine sends through the same Conn.
	require.NoError(t, conn.Send([][]byte{refused}, transport.Endpoint{Remote: netip.AddrPortFrom(b.addr, transport.RoCEv2Port)}))
	copy(a.buf, "fresh!!!")
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}))
	requireWC(t, a, 2, ib.WCSuccess)
	require.Equal(t, "fresh!!!", string(b.buf[:8]))
	require.Equal(t, dups+1, b.dev.Counters()["duplicate_request"], "the stray was seen, as a duplicate")
	require.Equal(t, ib.QPSRTS, qb.State())
}
