package cm_test

import (
	"math/rand/v2"
	"testing"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// A REQ from the same CA reusing the QPN of a live connection: the peer has
// forgotten the old one, so B refuses the REQ (REJ 10) and ends the old
// connection with a DREQ, as cm_match_req.
func TestStaleREQLiveConnection(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	oldA, oldB := l.established(0x11, 0x22)
	newA, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
	require.NoError(t, err)
	got := l.pump()
	require.Equal(t, []string{"A:REQ", "B:REJ", "B:DREQ", "A:DREP"}, attrs(got))
	rej := got[1].msg.(*mad.REJ)
	require.Equal(t, mad.REJStaleConn, rej.Reason)
	require.Zero(t, rej.LocalCommID)
	require.Equal(t, newA.LocalCommID(), rej.RemoteCommID)
	require.Equal(t, got[0].hdr.TID, got[1].hdr.TID)

	evs := l.a.take()
	require.Equal(t, []cm.EventType{cm.EventREJ, cm.EventDREQ}, types(evs))
	require.Equal(t, newA, evs[0].ID)
	require.Equal(t, mad.REJStaleConn, evs[0].Reason)
	require.Equal(t, oldA, evs[1].ID)
	// cm_rej_handler: a stale REJ puts the rejected ID in timewait.
	require.Equal(t, cm.StateTimewait, newA.State())
	require.Equal(t, cm.StateTimewait, oldA.State())
	require.Equal(t, []cm.EventType{cm.EventDisconnected}, types(l.b.take()))
	require.Equal(t, cm.StateTimewait, oldB.State())
	require.Equal(t, uint64(1), l.b.m.Counters()["rej_stale_conn"])
}

// A REQ reusing the QPN of a connection B holds in timewait: REJ 10, and no
// DREQ (nothing is established).
func TestStaleREQInTimewait(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	ida, idb := l.established(0x11, 0x22)
	require.NoError(t, ida.Disconnect(nil))
	l.pump()
	l.a.take()
	l.b.take()
	require.Equal(t, cm.StateTimewait, idb.State())

	_, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
	require.NoError(t, err)
	got := l.pump()
	require.Equal(t, []string{"A:REQ", "B:REJ"}, attrs(got))
	require.Equal(t, mad.REJStaleConn, got[1].msg.(*mad.REJ).Reason)
	require.Empty(t, l.b.events)

	// After timewait the QPN is free again.
	l.advance(timewait)
	l.a.take()
	l.b.take()
	_, err = l.a.m.Connect(l.connectParams(0x11), l.a.handler())
	require.NoError(t, err)
	l.pump()
	require.Equal(t, []cm.EventType{cm.EventREQ}, types(l.b.take()))
}

// A duplicate of the REQ of a connection now in timewait (same peer comm ID
// and CA GUID) is answered REJ 10 by cm_dup_req_handler.
func TestDuplicateREQInTimewait(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	ida, idb := l.established(0x11, 0x22)
	req := l.sent[0]
	require.Equal(t, uint16(mad.AttrREQ), req.hdr.AttrID)
	require.NoError(t, idb.Disconnect(nil))
	l.pump()
	require.Equal(t, cm.StateTimewait, ida.State())
	l.b.m.HandleMAD(req.src, req.dst, req.b)
	got := l.pump()
	require.Equal(t, []string{"B:REJ"}, attrs(got))
	rej := got[0].msg.(*mad.REJ)
	require.Equal(t, mad.REJStaleConn, rej.Reason)
	require.Equal(t, idb.LocalCommID(), rej.LocalCommID)
	require.Equal(t, uint8(mad.REJMsgOther), rej.MessageRejected)
	require.Equal(t, uint64(1), l.b.m.Counters()["rx_dup_req"])
}

// A duplicate REQ for an established connection is dropped (cm.c's default
// case), and never makes a second connection.
func TestDuplicateREQEstablishedDropped(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	l.established(0x11, 0x22)
	req := l.sent[0]
	l.b.m.HandleMAD(req.src, req.dst, req.b)
	require.Empty(t, l.pump())
	require.Empty(t, l.b.events)
	ids, _, _, _, _ := l.b.m.TableSizes()
	require.Equal(t, 1, ids)
}

// A flood of REQs from distinct peers: at most MaxHalfOpen wait for the
// consumer; the rest get REJ 3 and are counted. Answering frees a slot.
func TestHalfOpenFloodCapped(t *testing.T) {
	const maxHalfOpen = 4
	l := newLink(t, func(c *cm.Config) { c.MaxHalfOpen = maxHalfOpen })
	l.listen()
	r := rand.New(rand.NewPCG(9, 9))
	var rejected int
	for i := 0; i < 50; i++ {
		req := &mad.REQ{
			LocalCommID: r.Uint32() | 1, ServiceID: serviceID, LocalCAGUID: uint64(0x1000 + i),
			LocalQPN: uint32(0x100 + i), StartingPSN: 1, LocalCMResponseTimeout: 20,
			RemoteCMResponseTimeout: 20, MaxCMRetries: 15, PKey: 0xFFFF, PathMTU: 3,
			Primary: mad.Path{LocalGID: gidA, RemoteGID: gidB, LocalACKTimeout: 17},
		}
		b, err := mad.Marshal(uint64(i), req)
		require.NoError(t, err)
		l.b.m.HandleMAD(gidA, gidB, b)
		for _, p := range l.pump() {
			if rej, ok := p.msg.(*mad.REJ); ok {
				require.Equal(t, mad.REJNoResources, rej.Reason)
				require.Equal(t, req.LocalCommID, rej.RemoteCommID)
				rejected++
			}
		}
	}
	evs := l.b.take()
	require.Len(t, evs, maxHalfOpen)
	require.Equal(t, 50-maxHalfOpen, rejected)
	require.Equal(t, uint64(50-maxHalfOpen), l.b.m.Counters()["rej_no_resources"])
	ids, rids, rqps, _, _ := l.b.m.TableSizes()
	require.Equal(t, []int{maxHalfOpen, maxHalfOpen, maxHalfOpen}, []int{ids, rids, rqps}, "memory bounded")

	// Accepting keeps the slot until the RTU; rejecting frees it.
	require.NoError(t, evs[0].ID.Accept(acceptParams(0x22)))
	require.NoError(t, evs[1].ID.Reject(mad.REJConsumerDefined, nil, nil))
	l.pump()
	l.queue = nil
	req := &mad.REQ{LocalCommID: 77, ServiceID: serviceID, LocalCAGUID: 0x9999, LocalQPN: 0x999,
		PKey: 0xFFFF, Primary: mad.Path{LocalGID: gidA, RemoteGID: gidB, LocalACKTimeout: 17}}
	b, _ := mad.Marshal(99, req)
	l.b.m.HandleMAD(gidA, gidB, b)
	require.Equal(t, []cm.EventType{cm.EventREQ}, types(l.b.take()))
	l.b.m.HandleMAD(gidA, gidB, func() []byte { req.LocalCommID, req.LocalQPN = 78, 0x998; b, _ := mad.Marshal(100, req); return b }())
	require.Empty(t, l.b.events)
	require.Equal(t, uint64(50-maxHalfOpen+1), l.b.m.Counters()["rej_no_resources"])
	// An established connection no longer counts.
	evs[0].ID.Established()
	l.b.take()
	req.LocalCommID, req.LocalQPN = 79, 0x997
	b, _ = mad.Marshal(101, req)
	l.b.m.HandleMAD(gidA, gidB, b)
	require.Equal(t, []cm.EventType{cm.EventREQ}, types(l.b.take()))
}

// Malformed MADs, MADs of another class or attribute, and messages naming
// no ID are dropped (DREQ excepted: answered with a DREP, as cm.c) and
// counted; nothing else is sent and no state is created.
func TestBadMADsDroppedAndCounted(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	good, err := mad.Marshal(5, &mad.RTU{LocalCommID: 1, RemoteCommID: 2})
	require.NoError(t, err)
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	cases := []struct {
		name    string
		b       []byte
		counter string
	}{
		{"empty", nil, "rx_malformed"},
		{"header only", good[:24], "rx_malformed"},
		{"short", good[:255], "rx_malformed"},
		{"long", append(append([]byte(nil), good...), 0), "rx_malformed"},
		{"base version", mut(func(b []byte) []byte { b[0] = 2; return b }), "rx_bad_header"},
		{"class SA", mut(func(b []byte) []byte { b[1] = 0x03; return b }), "rx_bad_header"},
		{"class version 1", mut(func(b []byte) []byte { b[2] = 1; return b }), "rx_bad_header"},
		{"method GET", mut(func(b []byte) []byte { b[3] = 0x01; return b }), "rx_bad_header"},
		{"LAP", mut(func(b []byte) []byte { b[17] = 0x19; return b }), "rx_unknown_attr"},
		{"APR", mut(func(b []byte) []byte { b[17] = 0x1A; return b }), "rx_unknown_attr"},
		{"attr 0x99", mut(func(b []byte) []byte { b[17] = 0x99; return b }), "rx_unknown_attr"},
		{"RTU unknown comm ID", good, "rx_unknown_comm_id"},
	}
	want := map[string]uint64{}
	for _, c := range cases {
		l.b.m.HandleMAD(gidA, gidB, c.b)
		want[c.counter]++
	}
	for _, m := range []mad.Message{
		&mad.REP{LocalCommID: 3, RemoteCommID: 4},
		&mad.MRA{LocalCommID: 3, RemoteCommID: 4},
		&mad.REJ{LocalCommID: 3, RemoteCommID: 4, Reason: mad.REJConsumerDefined},
		&mad.DREP{LocalCommID: 3, RemoteCommID: 4},
		&mad.SIDRREP{RequestID: 3},
	} {
		b, err := mad.Marshal(6, m)
		require.NoError(t, err)
		l.b.m.HandleMAD(gidA, gidB, b)
		want["rx_unknown_comm_id"]++
	}
	require.Empty(t, l.pump(), "nothing answered")
	c := l.b.m.Counters()
	for k, v := range want {
		require.Equal(t, v, c[k], k)
	}
	// A DREQ for no ID still gets its DREP.
	b, _ := mad.Marshal(7, &mad.DREQ{LocalCommID: 3, RemoteCommID: 4})
	l.b.m.HandleMAD(gidA, gidB, b)
	got := l.pump()
	require.Equal(t, []string{"B:DREP"}, attrs(got))
	drep := got[0].msg.(*mad.DREP)
	require.Equal(t, uint32(4), drep.LocalCommID)
	require.Equal(t, uint32(3), drep.RemoteCommID)
	require.Equal(t, uint64(7), got[0].hdr.TID)
	require.Empty(t, l.b.events)
	ids, rids, rqps, sidr, _ := l.b.m.TableSizes()
	require.Zero(t, ids+rids+rqps+sidr)
}

// After Close nothing is sent and no handler runs.
func TestClose(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	_, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
	require.NoError(t, err)
	l.a.m.Close()
	l.pump()
	l.b.take()
	n := len(l.sent)
	l.advance(reqTimeout * 20)
	require.Len(t, l.sent, n)
	require.Empty(t, l.a.events)
	_, err = l.a.m.Connect(l.connectParams(0x12), l.a.handler())
	require.ErrorIs(t, err, cm.ErrClosed)
	l.a.m.HandleMAD(gidB, gidA, l.sent[0].b)
	require.Empty(t, l.pump())
}
