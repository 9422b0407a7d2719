package cm_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

func TestDisconnectFromEitherSide(t *testing.T) {
	for _, activeCloses := range []bool{true, false} {
		l := newLink(t, nil)
		l.listen()
		ida, idb := l.established(0x11, 0x22)
		closer, peer := ida, idb
		cs, ps := l.a, l.b
		if !activeCloses {
			closer, peer, cs, ps = idb, ida, l.b, l.a
		}
		require.NoError(t, closer.Disconnect([]byte("bye")))
		require.Equal(t, cm.StateDREQSent, closer.State())
		got := l.pump()
		require.Equal(t, []string{cs.name + ":DREQ", ps.name + ":DREP"}, attrs(got))
		dreq := got[0].msg.(*mad.DREQ)
		require.Equal(t, peer.LocalCommID(), dreq.RemoteCommID)
		require.Equal(t, closer.RemoteQPN(), dreq.RemoteQPN)
		require.Equal(t, got[0].hdr.TID, got[1].hdr.TID, "DREP echoes the DREQ's TID")
		require.Equal(t, uint64(closer.LocalCommID()), got[0].hdr.TID&0xFFFFFFFF, "DREQ TID: hi_tid | our comm ID")

		evs := ps.take()
		require.Equal(t, []cm.EventType{cm.EventDREQ}, types(evs))
		require.True(t, bytes.HasPrefix(evs[0].PrivateData, []byte("bye")))
		evs = cs.take()
		require.Equal(t, []cm.EventType{cm.EventDisconnected}, types(evs))
		require.NoError(t, evs[0].Err)
		require.Equal(t, cm.StateTimewait, closer.State())
		require.Equal(t, cm.StateTimewait, peer.State())
		require.ErrorIs(t, closer.Disconnect(nil), cm.ErrState)

		l.advance(timewait - time.Millisecond)
		require.Empty(t, l.a.events)
		require.Empty(t, l.b.events)
		l.advance(time.Millisecond)
		require.Equal(t, []cm.EventType{cm.EventTimewaitExit}, types(l.a.take()))
		require.Equal(t, []cm.EventType{cm.EventTimewaitExit}, types(l.b.take()))
		require.Equal(t, cm.StateIdle, ida.State())
		require.Equal(t, cm.StateIdle, idb.State())
		for _, m := range []*cm.Manager{l.a.m, l.b.m} {
			ids, rids, rqps, _, _ := m.TableSizes()
			require.Zero(t, ids+rids+rqps, "freed after timewait")
		}
		require.Equal(t, 0, l.clock.Pending())
	}
}

// Both sides send DREQ at once (cm.c: a DREQ in DREQ_SENT cancels ours and
// is answered): both get EventDREQ, both end in timewait, the DREP to each
// DREQ finds its sender already there and settles it (EventCrossedDREP:
// the peer has our DREQ and will not retry its own). Bug (session AJ):
// that DREP was dropped as a duplicate (rx_dup_drep) without an event, so
// pkg/rdmacm could not tell a settled crossed disconnect from one that
// might still need our DREP, and a lingering close sat out the timewait.
func TestCrossedDREQs(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	ida, idb := l.established(0x11, 0x22)
	require.NoError(t, ida.Disconnect(nil))
	require.NoError(t, idb.Disconnect(nil))
	got := l.pump()
	require.Equal(t, []string{"A:DREQ", "B:DREQ", "B:DREP", "A:DREP"}, attrs(got))
	require.Equal(t, []cm.EventType{cm.EventDREQ, cm.EventCrossedDREP}, types(l.a.take()))
	require.Equal(t, []cm.EventType{cm.EventDREQ, cm.EventCrossedDREP}, types(l.b.take()))
	require.Equal(t, cm.StateTimewait, ida.State())
	require.Equal(t, cm.StateTimewait, idb.State())
	require.Zero(t, l.a.m.Counters()["rx_dup_drep"], "the DREP answers our DREQ: no duplicate")
	require.Zero(t, l.b.m.Counters()["rx_dup_drep"])
	// No DREQ retransmission: both were cancelled.
	require.Empty(t, attrs(l.advance(timewait)))
	require.Equal(t, []cm.EventType{cm.EventTimewaitExit}, types(l.a.take()))
	require.Equal(t, []cm.EventType{cm.EventTimewaitExit}, types(l.b.take()))
	require.Equal(t, 0, l.clock.Pending())
}

func TestDREQLostIsRetransmitted(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	ida, idb := l.established(0x11, 0x22)
	l.drop = dropFirst(mad.AttrDREQ, 1)
	require.NoError(t, ida.Disconnect(nil))
	l.pump()
	require.Empty(t, l.b.events)
	// The active side's DREQ waits as long as its REQ did.
	require.Empty(t, attrs(l.advance(reqTimeout-time.Millisecond)))
	got := l.advance(time.Millisecond)
	require.Equal(t, []string{"A:DREQ", "B:DREP"}, attrs(got))
	require.Equal(t, []cm.EventType{cm.EventDREQ}, types(l.b.take()))
	require.Equal(t, []cm.EventType{cm.EventDisconnected}, types(l.a.take()))
	require.Equal(t, uint64(1), l.a.m.Counters()["tx_retries_dreq"])
	_ = idb
}

// The DREP is lost and B's timewait (512 ms) ends before A's DREQ retry
// (4608 ms): the retried DREQ names an ID B no longer has, and is still
// answered (cm_issue_drep), so A stops retrying.
func TestDREQAfterTimewaitAnsweredAnyway(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	ida, idb := l.established(0x11, 0x22)
	l.drop = dropFirst(mad.AttrDREP, 1)
	require.NoError(t, ida.Disconnect(nil))
	l.pump()
	require.Equal(t, []cm.EventType{cm.EventDREQ}, types(l.b.take()))
	require.Equal(t, cm.StateTimewait, idb.State())
	require.Less(t, timewait, reqTimeout)
	got := l.advance(reqTimeout)
	require.Equal(t, []string{"A:DREQ", "B:DREP"}, attrs(got))
	require.Equal(t, []cm.EventType{cm.EventTimewaitExit}, types(l.b.take()))
	require.Equal(t, []cm.EventType{cm.EventDisconnected}, types(l.a.take()))
	require.Equal(t, uint64(1), l.b.m.Counters()["rx_unknown_comm_id"])
}

// The DREP is lost while B's timewait outlasts A's DREQ retry: the
// duplicate DREQ finds B in TIMEWAIT, which resends its DREP
// (cm_dreq_handler's TIMEWAIT case).
func TestDuplicateDREQInTimewaitResendsDREP(t *testing.T) {
	// Packet life time 25 gives A a long timewait (av.timeout 26 ->
	// 262 s), and B (passive) retries its DREQ after CMTimeout(20).
	l := newLink(t, nil)
	l.listen()
	p := l.connectParams(0x11)
	p.PacketLifeTime = 25
	ida, err := l.a.m.Connect(p, l.a.handler())
	require.NoError(t, err)
	l.pump()
	idb := l.b.take()[0].ID
	require.NoError(t, idb.Accept(acceptParams(0x22)))
	l.pump()
	require.NoError(t, ida.SendRTU(nil))
	l.pump()
	l.a.take()
	l.b.take()

	l.drop = dropFirst(mad.AttrDREP, 1)
	require.NoError(t, idb.Disconnect(nil)) // B (passive) closes: its DREQ waits CMTimeout(20)
	l.pump()
	require.Equal(t, []cm.EventType{cm.EventDREQ}, types(l.a.take()))
	require.Equal(t, cm.StateTimewait, ida.State())
	got := l.advance(repTimeout)
	require.Equal(t, []string{"B:DREQ", "A:DREP"}, attrs(got))
	require.Equal(t, uint64(1), l.a.m.Counters()["rx_dup_dreq"])
	require.Equal(t, []cm.EventType{cm.EventDisconnected}, types(l.b.take()))
	require.Equal(t, cm.StateTimewait, ida.State())
}

func TestDREQTimeout(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	ida, _ := l.established(0x11, 0x22)
	l.drop = func(packet) bool { return true }
	require.NoError(t, ida.Disconnect(nil))
	l.pump()
	for i := 0; i < 15; i++ {
		l.advance(reqTimeout)
	}
	require.Empty(t, l.a.events)
	l.advance(reqTimeout)
	evs := l.a.take()
	require.Equal(t, []cm.EventType{cm.EventDisconnected}, types(evs))
	require.ErrorIs(t, evs[0].Err, cm.ErrTimeout)
	require.Equal(t, cm.StateTimewait, ida.State())
	l.advance(timewait)
	require.Equal(t, []cm.EventType{cm.EventTimewaitExit}, types(l.a.take()))
}

// A DREQ naming another QPN is dropped, as cm.c drops it.
func TestDREQWrongQPNDropped(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	ida, idb := l.established(0x11, 0x22)
	dreq := &mad.DREQ{LocalCommID: ida.LocalCommID(), RemoteCommID: idb.LocalCommID(), RemoteQPN: 0x99}
	b, err := mad.Marshal(1, dreq)
	require.NoError(t, err)
	l.b.m.HandleMAD(gidA, gidB, b)
	require.Empty(t, l.pump())
	require.Empty(t, l.b.events)
	require.Equal(t, cm.StateEstablished, idb.State())
	require.Equal(t, uint64(1), l.b.m.Counters()["rx_dreq_bad_qpn"])
}

func TestDestroy(t *testing.T) {
	t.Run("REQ_SENT sends REJ timeout with our GUID", func(t *testing.T) {
		l := newLink(t, nil)
		l.listen()
		ida, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
		require.NoError(t, err)
		l.pump()
		idb := l.b.take()[0].ID
		ida.Destroy()
		got := l.pump()
		require.Equal(t, []string{"A:REJ"}, attrs(got))
		rej := got[0].msg.(*mad.REJ)
		require.Equal(t, mad.REJTimeout, rej.Reason)
		require.Equal(t, []byte{0x02, 0, 0, 0xff, 0xfe, 0, 0, 0x01}, rej.ARI)
		// B finds its ID by (ARI GUID, REJ local comm ID).
		require.Equal(t, []cm.EventType{cm.EventREJ}, types(l.b.take()))
		require.Equal(t, cm.StateIdle, idb.State())
		require.Empty(t, l.a.events)
		require.Equal(t, 0, l.clock.Pending())
	})
	t.Run("ESTABLISHED sends one DREQ and frees", func(t *testing.T) {
		l := newLink(t, nil)
		l.listen()
		ida, idb := l.established(0x11, 0x22)
		ida.Destroy()
		got := l.pump()
		require.Equal(t, []string{"A:DREQ", "B:DREP"}, attrs(got))
		require.Equal(t, []cm.EventType{cm.EventDREQ}, types(l.b.take()))
		require.Equal(t, cm.StateTimewait, idb.State())
		require.Equal(t, cm.StateIdle, ida.State())
		require.Empty(t, l.a.events)
		ida.Destroy() // no-op
	})
}

// MaxDREQInterval caps the DREQ's retransmission wait (cm.c waits the
// REQ's or REP's timeout, seconds): with the cap below the peer's
// timewait, a DREQ whose DREP was lost is answered by the peer while it
// still holds the connection, the case of a user-space peer that exits
// after its timewait.
func TestMaxDREQIntervalCapsTheRetry(t *testing.T) {
	const cap = 300 * time.Millisecond
	l := newLink(t, func(c *cm.Config) { c.MaxDREQInterval = cap })
	l.listen()
	_, idb := l.established(0x11, 0x22)
	l.drop = dropFirst(mad.AttrDREP, 1)
	require.NoError(t, idb.Disconnect(nil))
	l.pump()
	require.Equal(t, []cm.EventType{cm.EventDREQ}, types(l.a.take()), "A answered, its DREP was lost")
	require.Empty(t, attrs(l.advance(cap-time.Millisecond)))
	got := l.advance(time.Millisecond)
	require.Equal(t, []string{"B:DREQ", "A:DREP"}, attrs(got), "retried after the cap; A, in timewait, answers again")
	evs := l.b.take()
	require.Equal(t, []cm.EventType{cm.EventDisconnected}, types(evs))
	require.NoError(t, evs[0].Err)
}

// The RTU is lost and A, established, disconnects at once: its DREQ finds
// B in REP_SENT. The peer sends a DREQ only from ESTABLISHED, so the
// connection was made: B reports EventEstablished, then EventDREQ, as
// librdmacm's rdma_accept succeeds on the DISCONNECTED event rdma_cm
// delivers there (ucma_complete fails only on a non-zero status), and
// answers with its DREP; the REP is not resent.
//
// Bug (found by the CM audit, session AF): B gave EventDREQ alone, for a
// connection it never reported established, so rdmacm's Accept failed
// with ErrDisconnected although A's Dial had succeeded and A's SENDs
// had already landed in B's receive queue.
func TestDREQBeforeRTUImpliesEstablished(t *testing.T) {
	for _, mra := range []bool{false, true} {
		l := newLink(t, nil)
		l.listen()
		ida, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
		require.NoError(t, err)
		l.pump()
		idb := l.b.take()[0].ID
		require.NoError(t, idb.Accept(acceptParams(0x22)))
		if mra {
			// A duplicate of the REP before A answers it draws A's
			// delayed MRA: B waits in MRA_REP_RCVD.
			l.a.react = func(ev cm.Event) {
				if ev.Type == cm.EventREP {
					rep := l.sent[len(l.sent)-1]
					l.a.m.HandleMAD(rep.src, rep.dst, rep.b)
				}
			}
		}
		l.pump()
		l.a.react = nil
		if mra {
			require.Equal(t, cm.StateMRAREPRcvd, idb.State())
			require.Equal(t, []cm.EventType{cm.EventMRA}, types(l.b.take()))
		} else {
			require.Equal(t, cm.StateREPSent, idb.State())
		}
		require.Equal(t, []cm.EventType{cm.EventREP}, types(l.a.take()))
		l.drop = dropFirst(mad.AttrRTU, 1)
		require.NoError(t, ida.SendRTU(nil))
		require.NoError(t, ida.Disconnect(nil))
		got := l.pump()
		require.Equal(t, []string{"A:DREQ", "B:DREP"}, attrs(got), "mra %v", mra)
		require.Equal(t, []cm.EventType{cm.EventEstablished, cm.EventDREQ}, types(l.b.take()), "mra %v", mra)
		require.Equal(t, []cm.EventType{cm.EventEstablished, cm.EventDisconnected}, types(l.a.take()))
		require.Equal(t, cm.StateTimewait, idb.State())
		got = l.advance(time.Minute)
		require.NotContains(t, attrs(got), "B:REP", "the REP stopped")
		require.Equal(t, []cm.EventType{cm.EventTimewaitExit}, types(l.b.take()))
		require.Equal(t, 0, l.clock.Pending())
	}
}
