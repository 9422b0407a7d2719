package qp

import (
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// A response for a PSN no request has used (a ghost: IBA 9.9.1 ignores
// responses outside the outstanding window) must not be taken as a
// coalesced ACK. rxed completed the outstanding WRITE on an ACK 0x10000
// PSNs past anything sent (rxed conform --serve, Q-GHOST-ACK); now it is
// ignored and counted, and the real ACK completes the WRITE later.
func TestGhostACKIgnored(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	l.post(SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 100)},
		RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()})
	req := l.a.env.take()
	require.Len(t, req, 1)
	sent := PSN(wire.BTH(req[0]).PSN())

	ack := func(psn PSN) []byte {
		h := wire.Headers{Opcode: wire.RCAck, PKey: DefaultPKey, DestQP: l.a.q.Num(), PSN: uint32(psn),
			Syndrome: wire.ACKSyndrome(31), MSN: 1}
		b := make([]byte, h.Len(0))
		_, err := h.Encode(b, nil)
		require.NoError(t, err)
		return b
	}
	for _, ghost := range []PSN{sent.Add(1), sent.Add(0x10000), sent.Add(0x7FFFFF)} {
		l.deliver(l.a, l.b, ack(ghost))
	}
	require.Empty(t, poll(t, l.a.scq), "a ghost ACK completed the WRITE")
	require.Equal(t, uint64(3), l.a.q.ctr.GhostResponses.Load())

	// The real exchange still completes it.
	l.deliver(l.b, l.a, req...)
	l.deliver(l.a, l.b, l.b.env.take()...)
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, 1)
	require.Equal(t, WCSuccess, wcs[0].Status)
}
