package qp

import (
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// retry_cnt is spent on retries, not on responses that find the
// requester already gone back: rxe_comp.c's COMPST_ERROR_RETRY leaves
// when "there is nothing to retry". A READ's reply arrives in one batch
// with a gap (go back), the missing response late (progress: the retry
// state is reset) and more responses past the next gap; the requester
// has not resent anything yet, so each of them is a gap with nothing to
// go back for. They used to spend one retry each and failed the READ
// with RETRY_EXC_ERR within one batch (`rxed perf read --fault loss=0.05`
// once the engine ran a QP after its whole batch, not after each packet).
func TestRetryCountNotSpentWithoutARetry(t *testing.T) {
	l := newLink(t, RC, 2, 7)
	for i := range l.b.buf[:2048] {
		l.b.buf[i] = byte(i * 7)
	}
	l.post(SendWR{ID: 1, Opcode: WRRDMARead, Flags: Signaled, SGL: []SGE{l.a.sge(0, 2048)}, RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()})
	l.deliver(l.b, l.a, l.a.env.take()...)
	r := l.b.env.take()
	require.Len(t, r, 8, "2048 bytes at MTU 256")

	for _, raw := range [][]byte{r[0], r[2], r[1], r[3], r[4], r[5], r[6], r[7]} {
		var p wire.Packet
		require.NoError(t, p.Parse(raw))
		ri := RecvInfo{Src: l.b.addr, Dst: l.a.addr}
		if l.a.q.Check(&p, &ri, l.a.addr.Addr()) == DropNone { // a QP in ERR drops
			l.a.q.Receive(l.a.env, &p, &ri, l.now)
		}
	}
	require.Empty(t, poll(t, l.a.scq), "no completion: the READ is still being asked for")
	require.Equal(t, RTS, l.a.q.attr.State)
	require.Zero(t, l.a.q.ctr.RetryExceededErr.Load())
	require.Equal(t, uint8(2), l.a.q.comp.retryCnt, "one go-back, after the progress that refilled the count")

	l.a.q.Run(l.a.env, l.now, 1000)
	again := l.a.env.take()
	require.Len(t, again, 1)
	psn, va, _ := parseReadRequest(t, again[0])
	require.Equal(t, PSN(wire.BTH(r[2]).PSN()), psn, "asked again from the first response missing")
	require.Equal(t, l.b.m.IOVA()+512, va)
	l.deliver(l.b, l.a, again...)
	l.deliver(l.a, l.b, l.b.env.take()...)
	requireOneRead(t, l, 2048)
}
