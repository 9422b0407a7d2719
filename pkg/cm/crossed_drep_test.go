package cm_test

import (
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// The DREP of a crossed disconnect (session AJ): a side that answered the
// peer's DREQ while its own was out learns from the DREP to its own that
// it owes the peer nothing more (EventCrossedDREP), whichever of the
// peer's DREQ and DREP reaches it first, and nothing on the wire changes.

// crossedLink is an established connection whose two sides have both
// called Disconnect, their DREQs queued and not yet delivered.
func crossedLink(t *testing.T) (*link, *cm.ID, *cm.ID) {
	t.Helper()
	l := newLink(t, nil)
	l.listen()
	ida, idb := l.established(0x11, 0x22)
	require.NoError(t, ida.Disconnect([]byte("a")))
	require.NoError(t, idb.Disconnect([]byte("b")))
	return l, ida, idb
}

// TestCrossedDREPAfterThePeersDREQ: each side gets the peer's DREQ, then
// the DREP to its own: EventDREQ, then EventCrossedDREP, once; a
// duplicate of that DREP is a duplicate again.
func TestCrossedDREPAfterThePeersDREQ(t *testing.T) {
	l, ida, _ := crossedLink(t)
	got := l.pump()
	require.Equal(t, []string{"A:DREQ", "B:DREQ", "B:DREP", "A:DREP"}, attrs(got))
	evs := l.a.take()
	require.Equal(t, []cm.EventType{cm.EventDREQ, cm.EventCrossedDREP}, types(evs))
	require.NoError(t, evs[1].Err)
	require.Equal(t, cm.StateTimewait, ida.State())
	require.Equal(t, []cm.EventType{cm.EventDREQ, cm.EventCrossedDREP}, types(l.b.take()))

	// B's DREP again (a network duplicate): no second event.
	var drepB packet
	for _, p := range got {
		if p.from == l.b && p.hdr.AttrID == mad.AttrDREP {
			drepB = p
		}
	}
	l.a.m.HandleMAD(drepB.src, drepB.dst, drepB.b)
	require.Empty(t, l.a.take())
	require.Equal(t, uint64(1), l.a.m.Counters()["rx_dup_drep"])
	require.Empty(t, l.pump(), "a DREP is never answered")
}

// TestCrossedDREPBeforeThePeersDREQ: B's DREQ is delayed past B's DREP
// (reordered): A takes the DREP in DREQ_SENT (EventDisconnected, no
// crossing on its side) and answers the late DREQ from timewait; B, which
// answered A's DREQ in DREQ_SENT, settles on A's DREP.
func TestCrossedDREPBeforeThePeersDREQ(t *testing.T) {
	l, ida, idb := crossedLink(t)
	var late []packet
	l.drop = func(p packet) bool {
		if p.from == l.b && p.hdr.AttrID == mad.AttrDREQ && late == nil {
			late = append(late, p)
			return true
		}
		return false
	}
	require.Equal(t, []string{"A:DREQ", "B:DREP"}, attrs(l.pump()))
	require.Equal(t, []cm.EventType{cm.EventDisconnected}, types(l.a.take()))
	require.Equal(t, []cm.EventType{cm.EventDREQ}, types(l.b.take()))
	require.Equal(t, cm.StateTimewait, ida.State())
	require.Equal(t, cm.StateTimewait, idb.State())

	l.drop = nil
	l.queue = append(l.queue, late...)
	require.Equal(t, []string{"B:DREQ", "A:DREP"}, attrs(l.pump()))
	require.Empty(t, l.a.take(), "A's DREQ had its DREP already: the late DREQ is a duplicate")
	require.Equal(t, uint64(1), l.a.m.Counters()["rx_dup_dreq"])
	require.Equal(t, []cm.EventType{cm.EventCrossedDREP}, types(l.b.take()))
	require.Empty(t, attrs(l.advance(timewait)))
	require.Equal(t, []cm.EventType{cm.EventTimewaitExit}, types(l.a.take()))
	require.Equal(t, []cm.EventType{cm.EventTimewaitExit}, types(l.b.take()))
}

// TestCrossedDREPSettlesWhileThePeerWaits: A's DREP to B's DREQ is lost,
// B's DREP to A's arrives: A settles (EventCrossedDREP) while B, which
// never learns that its DREQ was answered, sits out its timewait. A owes
// B nothing after that: B sends nothing more, its DREQ was cancelled when
// A's arrived.
func TestCrossedDREPSettlesWhileThePeerWaits(t *testing.T) {
	l, _, idb := crossedLink(t)
	l.drop = func(p packet) bool { return p.from == l.a && p.hdr.AttrID == mad.AttrDREP }
	require.Equal(t, []string{"A:DREQ", "B:DREQ", "B:DREP"}, attrs(l.pump()))
	require.Equal(t, []cm.EventType{cm.EventDREQ, cm.EventCrossedDREP}, types(l.a.take()))
	require.Equal(t, []cm.EventType{cm.EventDREQ}, types(l.b.take()))
	require.Equal(t, cm.StateTimewait, idb.State())
	// Through B's timewait and well past any DREQ retry it could make.
	require.Empty(t, attrs(l.advance(timewait)))
	require.Equal(t, []cm.EventType{cm.EventTimewaitExit}, types(l.b.take()))
	require.Equal(t, []cm.EventType{cm.EventTimewaitExit}, types(l.a.take()))
	require.Empty(t, attrs(l.advance(time.Minute)))
	require.Zero(t, l.b.m.Counters()["tx_retries_dreq"])
	require.Zero(t, l.a.m.Counters()["tx_retries_dreq"])
}

// TestAnsweredDREQHasNoCrossedDREP: a side that answered the peer's DREQ
// from ESTABLISHED (no DREQ of its own) gets no EventCrossedDREP: it may
// still owe the peer a DREP, if its own got lost.
func TestAnsweredDREQHasNoCrossedDREP(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	ida, _ := l.established(0x11, 0x22)
	require.NoError(t, ida.Disconnect(nil))
	require.Equal(t, []string{"A:DREQ", "B:DREP"}, attrs(l.pump()))
	require.Equal(t, []cm.EventType{cm.EventDREQ}, types(l.b.take()))
	require.Equal(t, []cm.EventType{cm.EventDisconnected}, types(l.a.take()))
	l.advance(timewait)
	require.Equal(t, []cm.EventType{cm.EventTimewaitExit}, types(l.b.take()))
}
