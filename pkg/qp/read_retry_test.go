package qp

import (
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// readRetrySetup posts a READ of 1000 bytes (4 responses at MTU 256),
// loses the second response and lets the retransmit timer fire: the
// requester asks again from the first missing PSN and byte.
func readRetrySetup(t *testing.T) (l *link, resp [][]byte, retry []byte) {
	l = newLink(t, RC, 7, 7)
	for i := range l.b.buf[:1000] {
		l.b.buf[i] = byte(i*3 + 1)
	}
	l.post(SendWR{ID: 1, Opcode: WRRDMARead, Flags: Signaled, SGL: []SGE{l.a.sge(0, 1000)},
		RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()})
	l.deliver(l.b, l.a, l.a.env.take()...)
	resp = l.b.env.take()
	require.Len(t, resp, 4)
	l.deliver(l.a, l.b, resp[0], resp[2], resp[3]) // resp[1] lost
	require.Empty(t, l.a.env.take())
	l.now = l.a.q.Deadline()
	l.a.q.OnTimer(l.a.env, l.now, 100)
	rs := l.a.env.take()
	require.Len(t, rs, 1)
	var p wire.Packet
	require.NoError(t, p.Parse(rs[0]))
	require.Equal(t, wire.RCReadRequest, p.Opcode)
	require.Equal(t, PSN(wire.BTH(resp[1]).PSN()), PSN(p.BTH.PSN()))
	require.Equal(t, l.b.m.IOVA()+256, p.RETH.VA())
	require.Equal(t, uint32(744), p.RETH.DMALen())
	return l, resp, rs[0]
}

// rxe answers a READ retried from a middle PSN (duplicate_request sets
// the resource to replay state) with READ_RESPONSE_MIDDLE … LAST, never
// FIRST. The requester resumes the READ from them, as rxe's completer
// (whose READ opcode state survives req_retry) does.
//
// Regression test: was TestRegressReadRetryAcceptsRxeMiddleReplay in regress_readretry_test.go
// (added in commit 97940c9).
func TestReadRetryAcceptsRxeMiddleReplay(t *testing.T) {
	l, resp, _ := readRetrySetup(t)
	// rxe's replay is exactly the original responses from the retried PSN.
	l.deliver(l.a, l.b, resp[1], resp[2], resp[3])
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, 1)
	require.Equal(t, WCSuccess, wcs[0].Status)
	require.Equal(t, l.b.buf[:1000], l.a.buf[:1000])
	require.True(t, l.a.q.Deadline().IsZero())
}

// Our responder replays a duplicate READ the way rxe does: from the
// requested PSN, MIDDLE … LAST when that is inside the READ, FIRST when
// the whole READ is asked for again.
//
// Regression test: was TestRegressReadReplayOpcodesAsRxe in regress_readretry_test.go
// (added in commit 97940c9).
func TestReadReplayOpcodesAsRxe(t *testing.T) {
	l, _, retry := readRetrySetup(t)
	l.deliver(l.b, l.a, retry)
	replay := l.b.env.take()
	require.Equal(t, []wire.Opcode{wire.RCReadResponseMiddle, wire.RCReadResponseMiddle, wire.RCReadResponseLast},
		opcodes(replay))
	l.deliver(l.a, l.b, replay...)
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, 1)
	require.Equal(t, WCSuccess, wcs[0].Status)
	require.Equal(t, l.b.buf[:1000], l.a.buf[:1000])
}
