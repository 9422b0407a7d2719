package cm_test

import (
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestEstablishedByCommEstThenLateRTUAndREP: with the RTU lost, the
// passive side's ID.Established (ib_cm_notify COMM_EST: its QP took the
// peer's first request) moves REP_SENT, or MRA_REP_RCVD after the peer's
// MRA, to ESTABLISHED with EventEstablished, counted (comm_est), and the
// REP stops. What comes after is harmless: the RTU arriving late is a
// duplicate (rx_dup_rtu); a REP retransmitted before the notification
// reaching the active side draws the RTU again (cm_dup_rep_handler), also
// a duplicate; a second notification does nothing and returns
// ErrAlreadyEstablished (cm_establish's -EISCONN; CM follow-up item 4,
// where it returned nil); nobody hears another
// event, and the connection disconnects as any other.
func TestEstablishedByCommEstThenLateRTUAndREP(t *testing.T) {
	for _, mra := range []bool{false, true} {
		l := newLink(t, nil)
		l.listen()
		ida, idb := l.reqDelivered(t)
		require.NoError(t, idb.Accept(acceptParams(0x22)))
		rep := l.sent[len(l.sent)-1]
		require.Equal(t, uint16(mad.AttrREP), rep.hdr.AttrID)
		if mra {
			l.a.react = func(ev cm.Event) {
				if ev.Type == cm.EventREP {
					l.a.m.HandleMAD(rep.src, rep.dst, rep.b) // draws A's MRA
				}
			}
		}
		l.pump()
		l.a.react = nil
		want := cm.StateREPSent
		if mra {
			want = cm.StateMRAREPRcvd
			require.Equal(t, []cm.EventType{cm.EventMRA}, types(l.b.take()))
		}
		require.Equal(t, want, idb.State())
		require.Equal(t, []cm.EventType{cm.EventREP}, types(l.a.take()))

		l.drop = dropFirst(mad.AttrRTU, 1)
		require.NoError(t, ida.SendRTU(nil))
		l.pump()
		require.Len(t, l.dropped, 1, "the RTU is lost")
		require.Equal(t, []cm.EventType{cm.EventEstablished}, types(l.a.take()))
		require.Equal(t, want, idb.State(), "mra %v", mra)

		require.NoError(t, idb.Established())
		require.Equal(t, cm.StateEstablished, idb.State())
		require.Equal(t, []cm.EventType{cm.EventEstablished}, types(l.b.take()))
		require.Equal(t, uint64(1), l.b.m.Counters()["comm_est"])
		require.Zero(t, l.clock.Pending(), "the REP's retransmission stopped")
		require.Empty(t, l.advance(time.Minute), "nothing resent")

		// The late RTU.
		rtu := l.dropped[0]
		l.b.m.HandleMAD(rtu.src, rtu.dst, rtu.b)
		require.Empty(t, l.pump())
		require.Equal(t, uint64(1), l.b.m.Counters()["rx_dup_rtu"])
		// A REP retransmitted before the notification, arriving late.
		l.a.m.HandleMAD(rep.src, rep.dst, rep.b)
		require.Equal(t, []string{"A:RTU"}, attrs(l.pump()))
		require.Equal(t, uint64(2), l.b.m.Counters()["rx_dup_rtu"])
		require.ErrorIs(t, idb.Established(), cm.ErrAlreadyEstablished, "a second notification: -EISCONN")
		require.Empty(t, l.pump())
		require.Empty(t, l.a.take())
		require.Empty(t, l.b.take())
		require.Equal(t, cm.StateEstablished, ida.State())
		require.Equal(t, cm.StateEstablished, idb.State())
		require.Equal(t, uint64(1), l.b.m.Counters()["comm_est"])

		require.NoError(t, idb.Disconnect(nil))
		require.Equal(t, []string{"B:DREQ", "A:DREP"}, attrs(l.pump()))
		require.Equal(t, []cm.EventType{cm.EventDisconnected}, types(l.b.take()))
		require.Equal(t, []cm.EventType{cm.EventDREQ}, types(l.a.take()))
	}
}

// TestEstablishedOnlyAfterTheREP: the notification means nothing before
// the REP went out (no connection yet) or on the active side before its
// RTU; it is ErrState there and changes nothing.
func TestEstablishedOnlyAfterTheREP(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	ida, idb := l.reqDelivered(t)
	require.ErrorIs(t, idb.Established(), cm.ErrState)
	require.Equal(t, cm.StateMRAREQSent, idb.State())
	require.ErrorIs(t, ida.Established(), cm.ErrState)
	require.Equal(t, cm.StateREQSent, ida.State())
	require.Empty(t, l.pump())
	require.Empty(t, l.a.take())
	require.Empty(t, l.b.take())
}
