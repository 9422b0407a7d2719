package cm_test

import (
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

func TestCMTimeout(t *testing.T) {
	for _, c := range []struct {
		t    uint8
		want time.Duration
	}{{0, time.Millisecond}, {8, time.Millisecond}, {9, 2 * time.Millisecond}, {16, 256 * time.Millisecond},
		{20, 4096 * time.Millisecond}, {24, 65536 * time.Millisecond}, {31, 8388608 * time.Millisecond}} {
		require.Equal(t, c.want, cm.CMTimeout(c.t), "t=%d", c.t)
	}
}

func TestREQRetransmitThenTimeout(t *testing.T) {
	l := newLink(t, nil)
	l.drop = func(packet) bool { return true } // B never hears
	p := l.connectParams(0x11)
	p.MaxCMRetries = 3
	ida, err := l.a.m.Connect(p, l.a.handler())
	require.NoError(t, err)
	l.pump()
	require.Len(t, l.sent, 1)
	for retry := 1; retry <= 3; retry++ {
		l.advance(reqTimeout - time.Millisecond)
		require.Len(t, l.sent, retry, "no retransmission before the timeout")
		l.advance(time.Millisecond)
		require.Len(t, l.sent, retry+1, "retransmission %d at the timeout", retry)
		require.Equal(t, l.sent[0].b, l.sent[retry].b, "the same REQ, same TID")
	}
	require.Empty(t, l.a.events)
	l.advance(reqTimeout)
	require.Len(t, l.sent, 4, "1 + MaxCMRetries sends")
	evs := l.a.take()
	require.Equal(t, []cm.EventType{cm.EventTimeout}, types(evs))
	require.Equal(t, mad.REJTimeout, evs[0].Reason)
	require.ErrorIs(t, evs[0].Err, cm.ErrTimeout)
	require.Equal(t, cm.StateIdle, ida.State())
	require.Equal(t, 0, l.clock.Pending())
	c := l.a.m.Counters()
	require.Equal(t, uint64(4), c["tx_req"], "tx_req counts every send, as cm.c's cm_tx_msgs")
	require.Equal(t, uint64(3), c["tx_retries_req"])
	require.Equal(t, uint64(1), c["timeouts"])
	l.advance(time.Hour)
	require.Len(t, l.sent, 4)
}

// The REP is lost; the REQ's retransmission reaches B in REP_SENT, which
// resends its REP; A connects once, B has one connection.
func TestREPLostDuplicateREQResendsREP(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	p := l.connectParams(0x11)
	// Make B's own REP timer (CMTimeout(22) = 16 s) slower than A's
	// REQ timer, so that the duplicate REQ is what brings the REP back.
	p.LocalCMResponseTimeout = 22
	ida, err := l.a.m.Connect(p, l.a.handler())
	require.NoError(t, err)
	l.pump()
	idb := l.b.take()[0].ID
	l.drop = dropFirst(mad.AttrREP, 1)
	require.NoError(t, idb.Accept(acceptParams(0x22)))
	l.pump()
	require.Len(t, l.dropped, 1)
	require.Empty(t, l.a.events)

	got := l.advance(reqTimeout)
	require.Equal(t, []string{"A:REQ", "B:REP"}, attrs(got))
	require.Equal(t, []cm.EventType{cm.EventREP}, types(l.a.take()))
	require.Empty(t, l.b.events, "no second EventREQ")
	require.NoError(t, ida.SendRTU(nil))
	l.pump()
	require.Equal(t, []cm.EventType{cm.EventEstablished}, types(l.b.take()))
	require.Equal(t, cm.StateEstablished, idb.State())
	cb := l.b.m.Counters()
	require.Equal(t, uint64(1), cb["rx_dup_req"])
	ids, rids, rqps, _, _ := l.b.m.TableSizes()
	require.Equal(t, []int{1, 1, 1}, []int{ids, rids, rqps}, "one connection on B")
	// No timer fires any more.
	require.Empty(t, attrs(l.advance(time.Minute)))
}

// The REP itself is retransmitted when nothing answers it.
func TestREPRetransmitThenTimeout(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	p := l.connectParams(0x11)
	p.MaxCMRetries = 2
	_, err := l.a.m.Connect(p, l.a.handler())
	require.NoError(t, err)
	l.pump()
	idb := l.b.take()[0].ID
	l.drop = func(p packet) bool { return true }
	require.NoError(t, idb.Accept(acceptParams(0x22)))
	l.pump()
	l.clock.Advance(repTimeout)
	l.pump()
	l.clock.Advance(repTimeout)
	l.pump()
	reps := 0
	for _, p := range l.sent {
		if p.hdr.AttrID == mad.AttrREP {
			reps++
		}
	}
	require.Equal(t, 3, reps, "1 + the REQ's max CM retries")
	l.clock.Advance(repTimeout)
	l.pump()
	evs := l.b.take()
	require.Equal(t, []cm.EventType{cm.EventTimeout}, types(evs))
	require.Equal(t, cm.StateIdle, idb.State())
}

// The RTU is lost: B retransmits its REP, A (established) answers the
// duplicate REP with the RTU again.
func TestRTULostDuplicateREPResendsRTU(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	ida, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
	require.NoError(t, err)
	l.pump()
	idb := l.b.take()[0].ID
	require.NoError(t, idb.Accept(acceptParams(0x22)))
	l.pump()
	l.a.take()
	l.drop = dropFirst(mad.AttrRTU, 1)
	require.NoError(t, ida.SendRTU([]byte("rtu-pd")))
	l.pump()
	require.Equal(t, []cm.EventType{cm.EventEstablished}, types(l.a.take()))
	require.Equal(t, cm.StateEstablished, ida.State())
	require.Equal(t, cm.StateREPSent, idb.State())

	got := l.advance(repTimeout)
	require.Equal(t, []string{"B:REP", "A:RTU"}, attrs(got))
	rtu := got[1].msg.(*mad.RTU)
	require.Equal(t, "rtu-pd", string(rtu.PrivateData[:6]), "the RTU resent with its private data")
	require.Equal(t, []cm.EventType{cm.EventEstablished}, types(l.b.take()))
	require.Empty(t, l.a.events, "no second EventREP")
	require.Equal(t, uint64(1), l.a.m.Counters()["rx_dup_rep"])
}

// Established() (ib_cm_notify COMM_EST) ends REP_SENT without the RTU.
func TestEstablishedByTraffic(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	_, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
	require.NoError(t, err)
	l.pump()
	idb := l.b.take()[0].ID
	l.drop = func(packet) bool { return true }
	require.NoError(t, idb.Accept(acceptParams(0x22)))
	l.pump()
	require.NoError(t, idb.Established())
	require.Equal(t, []cm.EventType{cm.EventEstablished}, types(l.b.take()))
	before := l.b.m.Counters()["tx_rep"]
	l.advance(time.Minute)
	require.Equal(t, before, l.b.m.Counters()["tx_rep"], "REP retransmission stopped")
	require.Equal(t, cm.StateEstablished, idb.State())
}

// A duplicate REQ before the consumer answers gets the delayed MRA; the MRA
// moves A's next deadline to service timeout + packet life time.
func TestMRAExtendsWait(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	ida, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
	require.NoError(t, err)
	l.pump()
	idb := l.b.take()[0].ID

	got := l.advance(reqTimeout)
	require.Equal(t, []string{"A:REQ", "B:MRA"}, attrs(got))
	mra := got[1].msg.(*mad.MRA)
	require.Equal(t, uint8(mad.MRAMsgREQ), mra.MessageMRAed)
	require.Equal(t, uint8(24), mra.ServiceTimeout)
	require.Equal(t, idb.LocalCommID(), mra.LocalCommID)
	require.Equal(t, ida.LocalCommID(), mra.RemoteCommID)
	evs := l.a.take()
	require.Equal(t, []cm.EventType{cm.EventMRA}, types(evs))
	require.Equal(t, uint8(24), evs[0].ServiceTimeout)
	require.Equal(t, cm.StateMRAREQRcvd, ida.State())
	require.Empty(t, l.b.events)

	// CMTimeout(24) + CMTimeout(av.timeout 17) = 65536 + 512 ms.
	extended := 65536*time.Millisecond + timewait
	d, ok := l.clock.NextDeadline()
	require.True(t, ok)
	require.Equal(t, extended, d)
	n := len(l.sent)
	l.advance(14 * reqTimeout) // all the old schedule's retries
	require.Len(t, l.sent, n, "nothing resent inside the MRA's wait")
	require.Empty(t, l.a.events)

	// The consumer answers in time: the connection completes.
	require.NoError(t, idb.Accept(acceptParams(0x22)))
	l.pump()
	require.Equal(t, []cm.EventType{cm.EventREP}, types(l.a.take()))
	require.NoError(t, ida.SendRTU(nil))
	l.pump()
	require.Equal(t, cm.StateEstablished, idb.State())
}

// Without an answer after the MRA, the REQ is resent at the MRA's deadline
// and a duplicate MRA is counted, not re-evented.
func TestMRAWaitExpires(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	_, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
	require.NoError(t, err)
	l.pump()
	l.advance(reqTimeout)
	require.Equal(t, []cm.EventType{cm.EventMRA}, types(l.a.take()))
	got := l.advance(65536*time.Millisecond + timewait)
	require.Equal(t, []string{"A:REQ", "B:MRA"}, attrs(got))
	require.Empty(t, l.a.events)
	require.Equal(t, uint64(1), l.a.m.Counters()["rx_dup_mra"])
	require.Equal(t, uint64(2), l.b.m.Counters()["rx_dup_req"])
}

// Over a wire losing a third of everything, the connection still comes up
// once, and timers settle.
func TestLossyWireConnects(t *testing.T) {
	up := 0
	for seed := uint64(1); seed <= 20; seed++ {
		l := newLink(t, nil)
		l.b.react = func(ev cm.Event) {
			if ev.Type == cm.EventREQ {
				require.NoError(t, ev.ID.Accept(acceptParams(0x22)))
			}
		}
		l.listen()
		l.a.react = func(ev cm.Event) {
			if ev.Type == cm.EventREP {
				require.NoError(t, ev.ID.SendRTU(nil))
			}
		}
		l.drop = lossy(seed, 0.33)
		ida, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
		require.NoError(t, err)
		l.pump()
		for i := 0; i < 200 && l.clock.Pending() > 0; i++ {
			d, _ := l.clock.NextDeadline()
			l.advance(d)
		}
		reqs := 0
		for _, e := range l.b.events {
			if e.Type == cm.EventREQ {
				reqs++
			}
		}
		require.Equal(t, 1, reqs, "seed %d: one connection on B", seed)
		sa := ida.State()
		if sa == cm.StateEstablished {
			up++
			require.Contains(t, types(l.b.events), cm.EventEstablished, "seed %d", seed)
		} else {
			require.Equal(t, cm.StateIdle, sa, "seed %d", seed)
		}
		require.Equal(t, 0, l.clock.Pending(), "seed %d: timers settle", seed)
	}
	t.Logf("%d of 20 connections up", up)
	require.GreaterOrEqual(t, up, 18, "15 retries beat a 33%% loss")
}
