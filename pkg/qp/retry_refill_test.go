package qp

import (
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// Bug (found by the protocol audit, session AF): any response inside the
// outstanding window refilled retry_cnt, even one that only reports the
// same gap again, so a READ whose reply never got past its gap retried
// for ever and never completed with RETRY_EXC_ERR. A path that drops
// full-sized packets (a RoCE MTU above what the path carries) does just
// that: each READ asked for again is answered by rxe in full (rxe bounds
// no replays), and only the short READ_RESPONSE_LAST arrives. Each one
// refilled the count that the retry it caused then spent: 1000 rounds
// (999 local ACK timeouts) with retry_cnt 7 left the QP in RTS with the
// READ outstanding, where rxe fails it after 7 retries. Refills without
// progress are now bounded (retry_cnt of them), so the loss tolerance
// stays but a stall ends in RETRY_EXC_ERR.
func TestRetryCountRunsOutWhenOnlyAReadTailArrives(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	l.post(SendWR{ID: 1, Opcode: WRRDMARead, Flags: Signaled, SGL: []SGE{l.a.sge(0, 1000)},
		RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()},
		SendWR{ID: 2, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 10)}})
	req := l.a.env.take()
	require.Equal(t, []wire.Opcode{wire.RCReadRequest, wire.RCSendOnly}, opcodes(req))
	first := PSN(wire.BTH(req[0]).PSN())
	// 1000 bytes at MTU 256: FIRST, MIDDLE, MIDDLE (256 bytes, lost on
	// the path) and LAST (232 bytes, delivered).
	tail := func() []byte {
		h := wire.Headers{Opcode: wire.RCReadResponseLast, PKey: DefaultPKey, DestQP: l.a.q.Num(),
			PSN: uint32(first.Add(3)), Syndrome: wire.ACKSyndrome(31), MSN: 1}
		b := make([]byte, h.Len(232))
		_, err := h.Encode(b, make([]byte, 232))
		require.NoError(t, err)
		return b
	}
	rounds := 0
	for ; rounds < 1000 && l.a.q.State() == RTS; rounds++ {
		l.deliver(l.a, l.b, tail())
		if len(l.a.env.take()) == 0 && !l.a.q.Deadline().IsZero() {
			l.now = l.a.q.Deadline()
			l.a.q.OnTimer(l.a.env, l.now, 1000)
			l.a.env.take()
		}
	}
	require.Equal(t, Err, l.a.q.State(), "after %d rounds without progress", rounds)
	require.Less(t, rounds, 100)
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, 2)
	require.Equal(t, WCRetryExcErr, wcs[0].Status)
	require.Equal(t, uint64(1), wcs[0].ID)
	require.Equal(t, WCWRFlushErr, wcs[1].Status)
}
