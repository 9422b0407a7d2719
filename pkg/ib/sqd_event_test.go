package ib_test

import (
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/stretchr/testify/require"
)

// nextSQDrained waits for the next SQ_DRAINED event on d, failing on any
// other QP-level event (PORT_ACTIVE from the device's opening is
// skipped).
func nextSQDrained(t *testing.T, d *ib.Device) ib.AsyncEvent {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ev := <-d.Events():
			if ev.Type == ib.EventPortActive {
				continue
			}
			require.Equal(t, ib.EventSQDrained.String(), ev.Type.String(), "unexpected event %+v", ev)
			return ev
		case <-timeout:
			t.Fatal("no SQ_DRAINED event within 20 s")
		}
	}
}

// pendingEvents returns the events already queued on p's device
// (PORT_ACTIVE skipped), without waiting for the engine.
func pendingEvents(t *testing.T, p *peer) []ib.AsyncEvent {
	t.Helper()
	var evs []ib.AsyncEvent
	for _, ev := range unreadEvents(t, p) {
		if ev.Type != ib.EventPortActive {
			evs = append(evs, ev)
		}
	}
	return evs
}

func sqDraining(t *testing.T, q *ib.QP) bool {
	t.Helper()
	a, _, err := q.Query()
	require.NoError(t, err)
	return a.SQDraining
}

// An RC SEND held up by RNR NAKs (the peer has no receive posted, infinite
// rnr_retry) is in flight when its QP moves to SQD with
// en_sqd_async_notify: Query reports sq_draining and leaving SQD is
// refused until the peer posts a receive; then SQ_DRAINED arrives for
// that QP, sq_draining is off, and the SEND posted in SQD goes out only
// after SQD->RTS.
func TestSQDrainedEventEndToEnd(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRSend, Flags: ib.SendSignaled | ib.SendInline,
		Inline: []byte("before SQD")}))
	// The SEND has started once the peer has refused it.
	require.Eventually(t, func() bool { return a.dev.Counters()["rcvd_rnr_err"] > 0 },
		20*time.Second, time.Millisecond, "the SEND draws RNR NAKs")

	require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSSQD, EnSQDAsyncNotify: true},
		ib.AttrState|ib.AttrEnSQDAsyncNotify))
	attr, _, err := qa.Query()
	require.NoError(t, err)
	require.Equal(t, ib.QPSSQD, attr.State)
	require.True(t, attr.SQDraining, "the SEND waits for a receive")
	require.True(t, attr.EnSQDAsyncNotify)
	err = qa.Modify(&ib.QPAttr{State: ib.QPSRTS}, ib.AttrState)
	require.ErrorIs(t, err, ib.ErrSQDraining)
	require.Equal(t, ib.QPSSQD, qa.State())
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRSend, Flags: ib.SendSignaled | ib.SendInline,
		Inline: []byte("posted in SQD")}))
	require.Empty(t, pendingEvents(t, a))

	require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 10, SGL: []ib.SGE{b.sge(0, 64)}},
		ib.RecvWR{ID: 11, SGL: []ib.SGE{b.sge(64, 64)}}))
	ev := nextSQDrained(t, a.dev)
	require.Equal(t, qa.Num(), ev.QPN)
	require.Equal(t, 5, int(ev.Type), "IBV_EVENT_SQ_DRAINED")
	require.Equal(t, "SQ_DRAINED", ev.Type.String())
	require.False(t, sqDraining(t, qa))
	require.Equal(t, ib.QPSSQD, qa.State())
	requireWC(t, a, 1, ib.WCSuccess) // queued before the event was raised
	rwc := requireWC(t, b, 10, ib.WCSuccess)
	require.Equal(t, "before SQD", string(b.buf[:rwc.ByteLen]))
	sent := a.dev.Counters()["sent_pkts"]
	_, _, err = qa.Query() // a round trip through the QP's worker
	require.NoError(t, err)
	require.Equal(t, sent, a.dev.Counters()["sent_pkts"], "SEND 2 waits in SQD")
	require.Zero(t, a.cq.Len())

	require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSRTS}, ib.AttrState))
	requireWC(t, a, 2, ib.WCSuccess)
	rwc = requireWC(t, b, 11, ib.WCSuccess)
	require.Equal(t, "posted in SQD", string(b.buf[64:64+rwc.ByteLen]))
	require.Empty(t, pendingEvents(t, a), "one event per move into SQD")
	requireWorks(t, a, qa, b, qb)
}

// Without en_sqd_async_notify no event is raised; a QP with nothing in
// flight (here an RC QP at rest, and a UD QP after its datagram left) is
// drained at once. Both QPs share the device's single worker, so the UD
// QP's event, raised after the RC QP's drain, proves the RC QP raised
// none.
func TestSQDrainedOnlyWhenAsked(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	ud := a.createQP(ib.UD)
	require.NoError(t, ud.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, QKey: 0x77},
		ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrQKey))
	require.NoError(t, ud.Modify(&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState))
	require.NoError(t, ud.Modify(&ib.QPAttr{State: ib.QPSRTS, SQPSN: 1}, ib.AttrState|ib.AttrSQPSN))
	ah, err := a.pd.CreateAH(ib.AHAttr{DGID: b.addr, DestPort: b.dev.UDPPort(), PortNum: 1})
	require.NoError(t, err)
	t.Cleanup(func() { ah.Destroy() })
	wr := ib.SendWR{ID: 20, Opcode: ib.WRSend, Flags: ib.SendSignaled | ib.SendInline, Inline: []byte("dgram")}
	ib.UDSend(&wr, ah, 0x123, 0x77)
	require.NoError(t, ud.PostSend(wr))
	requireWC(t, a, 20, ib.WCSuccess)

	require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSSQD}, ib.AttrState))
	require.False(t, sqDraining(t, qa))
	require.NoError(t, ud.Modify(&ib.QPAttr{State: ib.QPSSQD, EnSQDAsyncNotify: true},
		ib.AttrState|ib.AttrEnSQDAsyncNotify))
	ev := nextSQDrained(t, a.dev)
	require.Equal(t, ud.Num(), ev.QPN, "the first SQ_DRAINED is the UD QP's: the RC QP asked for none")
	require.False(t, sqDraining(t, ud))
	require.Empty(t, pendingEvents(t, a))

	// Both resume.
	require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSRTS}, ib.AttrState))
	require.NoError(t, ud.Modify(&ib.QPAttr{State: ib.QPSRTS}, ib.AttrState))
	requireWorks(t, a, qa, b, qb)
	require.NoError(t, ud.PostSend(wr))
	requireWC(t, a, 20, ib.WCSuccess)
	require.NoError(t, ud.Destroy())
}
