package cm_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// victim is a third party whose address a forged REQ claims as its source.
var victim = netip.MustParseAddr("::ffff:10.0.0.99")

// forgedREQ is the nth REQ "from" a forged source, asking for the most REP retransmissions
// the field allows, as fast as it allows (CMTimeout(0) = 1 ms).
func forgedREQ(t *testing.T, tid uint64, n uint32) []byte {
	t.Helper()
	req := &mad.REQ{
		LocalCommID: 0x5150_0001 + n, ServiceID: serviceID, LocalCAGUID: 0x0bad,
		LocalQPN: 0x77 + n, StartingPSN: 1, LocalCMResponseTimeout: 0,
		RemoteCMResponseTimeout: 0, MaxCMRetries: 15, PKey: 0xFFFF, PathMTU: 3,
		Primary: mad.Path{LocalGID: victim, RemoteGID: gidB, LocalACKTimeout: 1},
	}
	b, err := mad.Marshal(tid, req)
	require.NoError(t, err)
	return b
}

// repsTo counts the REPs sent to dst.
func (l *link) repsTo(dst netip.Addr) int {
	n := 0
	for _, p := range l.sent {
		if p.hdr.AttrID == mad.AttrREP && p.dst == dst {
			n++
		}
	}
	return n
}

// Bug (found by the security audit, session AF): the passive side
// retransmitted its REP as often and as fast as the REQ asked (up to 15
// retries, 1 ms apart), so each forged REQ naming a third party's address
// made a listener that accepts (an rdma_cm server, rxed serve
// --rdma-cm-port) send that address 16 MADs of the same size: a 16x
// reflector. Until the peer answers, a REQ now pays for 3 REPs (QUIC's
// anti-amplification factor, as the daemon's GID proof), and the
// retransmissions past that share a small allowance: 500 forged REQs got
// 8000 REPs sent to the victim before, at most 3 x 500 + 32 now.
func TestREPReflectionIsBounded(t *testing.T) {
	const forged = 500
	l := newLink(t, nil)
	l.listen()
	for i := range forged {
		l.b.m.HandleMAD(victim, gidB, forgedREQ(t, uint64(i), uint32(i)))
	}
	evs := l.b.take()
	require.Len(t, evs, forged)
	for _, ev := range evs {
		require.NoError(t, ev.ID.Accept(acceptParams(0x22)))
	}
	l.pump()
	l.advance(time.Minute)
	require.LessOrEqual(t, l.repsTo(victim), 3*forged+32, "REPs reflected to the REQs' claimed source")
	require.Len(t, l.b.take(), forged, "every unanswered REP still times out")
	require.Equal(t, 0, l.clock.Pending())
	require.Positive(t, l.b.m.Counters()["rep_retries_limited"])
}

// A peer that repeats its REQ (its own retransmissions, when the REP was
// lost) gets the REP at once and pays for 2 more retransmissions; with
// the shared allowance spent, that is all it gets.
func TestREPBudgetGrowsWithDuplicateREQs(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	// Spend the allowance with a flood first.
	for i := range 100 {
		l.b.m.HandleMAD(victim, gidB, forgedREQ(t, uint64(i), uint32(i)))
	}
	for _, ev := range l.b.take() {
		require.NoError(t, ev.ID.Accept(acceptParams(0x22)))
	}
	l.pump()
	l.advance(20 * time.Millisecond)
	l.b.take()
	// Then one more, and its duplicates.
	other := netip.MustParseAddr("::ffff:10.0.0.98")
	b := forgedREQ(t, 1000, 1000)
	l.b.m.HandleMAD(other, gidB, b)
	evs := l.b.take()
	require.Len(t, evs, 1)
	require.NoError(t, evs[0].ID.Accept(acceptParams(0x22)))
	l.pump()
	l.advance(5 * time.Millisecond)
	require.Equal(t, 3, l.repsTo(other), "3 REPs for the first REQ")
	for range 2 {
		l.b.m.HandleMAD(other, gidB, b)
		l.pump()
	}
	require.Equal(t, 5, l.repsTo(other), "each duplicate answered at once")
	require.Empty(t, l.b.take(), "no new REQ event for a duplicate")
	l.advance(7 * time.Millisecond)
	require.Equal(t, 9, l.repsTo(other), "and 2 more retransmissions each")
	l.advance(time.Millisecond)
	require.Equal(t, 9, l.repsTo(other))
	l.advance(time.Minute)
	require.Equal(t, []cm.EventType{cm.EventTimeout}, types(l.b.take()))
}

// A peer that answered (its RTU established the connection) is no
// stranger: B's DREQ is retransmitted as often as its REQ asked.
func TestDREQRetriesAfterEstablishmentKeepTheREQsCount(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	p := l.connectParams(0x11)
	p.MaxCMRetries = 6
	ida, err := l.a.m.Connect(p, l.a.handler())
	require.NoError(t, err)
	l.pump()
	idb := l.b.take()[0].ID
	require.NoError(t, idb.Accept(acceptParams(0x22)))
	l.pump()
	require.NoError(t, ida.SendRTU(nil))
	l.pump()
	require.Equal(t, cm.StateEstablished, idb.State())
	l.drop = func(packet) bool { return true }
	require.NoError(t, idb.Disconnect(nil))
	l.pump()
	l.advance(10 * time.Minute)
	n := 0
	for _, p := range l.sent {
		if p.hdr.AttrID == mad.AttrDREQ {
			n++
		}
	}
	require.Equal(t, 7, n, "1 + the REQ's MaxCMRetries DREQs")
}

// Bug (found by the security audit, session AF): every SIDR_REP a
// listener sent was kept for a minute to answer duplicates, with no
// bound, and each reply scanned all of them: a flood of SIDR_REQs with
// distinct request IDs (or forged sources) to a UD service grew the
// table by one entry, and each answer's cost by one step, per request
// (20,000 kept after 20,000 requests). Now at most maxSIDRAnswers are
// kept, the oldest forgotten first (its late duplicate then reaches the
// listener as a new request, as with cm.c), and a reply costs O(1).
func TestSIDRAnswersBounded(t *testing.T) {
	l := newLink(t, nil)
	_, err := l.b.m.Listen(udpService, 0, l.b.handler())
	require.NoError(t, err)
	const flood = 20000
	for i := range flood {
		req := &mad.SIDRREQ{RequestID: uint32(i + 1), ServiceID: udpService}
		b, err := mad.Marshal(uint64(i), req)
		require.NoError(t, err)
		l.b.m.HandleMAD(victim, gidB, b)
		evs := l.b.take()
		require.Len(t, evs, 1)
		require.NoError(t, evs[0].ID.SIDRReply(cm.SIDRReplyParams{QPN: 0x33, QKey: 0x1234}))
		l.queue = l.queue[:0]
		l.sent = l.sent[:0]
		if i%1000 == 0 {
			l.advance(time.Millisecond) // all within the answer window
		}
	}
	require.LessOrEqual(t, l.b.m.SIDRAnswers(), 4096)
	// The newest answers still serve their duplicates.
	req := &mad.SIDRREQ{RequestID: flood, ServiceID: udpService}
	b, err := mad.Marshal(1, req)
	require.NoError(t, err)
	l.b.m.HandleMAD(victim, gidB, b)
	require.Empty(t, l.b.take(), "a duplicate of a kept answer is not a new request")
	require.Len(t, l.sent, 1)
	require.Equal(t, uint64(1), l.b.m.Counters()["rx_dup_sidr_req"])
	// After the window every answer is forgotten.
	l.advance(time.Minute)
	l.b.m.HandleMAD(victim, gidB, b)
	require.Len(t, l.b.take(), 1)
}
