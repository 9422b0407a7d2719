package cm_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

const udpService = 0x0000_0000_0111_1C06 // RDMA_PS_UDP, port 7174 (rdmacm_udaddy.pcap)

func TestSIDRSuccess(t *testing.T) {
	l := newLink(t, nil)
	_, err := l.b.m.Listen(udpService, 0, l.b.handler())
	require.NoError(t, err)
	require.NoError(t, queried(l.a.m.SIDRQuery(cm.SIDRParams{Src: gidA, Dst: gidB, ServiceID: udpService,
		PrivateData: []byte("cma header")}, l.a.sidrHandler())))
	got := l.pump()
	require.Equal(t, []string{"A:SIDR_REQ"}, attrs(got))
	sreq := got[0].msg.(*mad.SIDRREQ)
	require.Equal(t, uint64(udpService), sreq.ServiceID)
	require.Equal(t, uint16(0xFFFF), sreq.PKey)
	evs := l.b.take()
	require.Equal(t, []cm.EventType{cm.EventSIDRREQ}, types(evs))
	require.Equal(t, sreq.RequestID, evs[0].SIDRREQ.RequestID)
	require.True(t, bytes.HasPrefix(evs[0].PrivateData, []byte("cma header")))
	require.Equal(t, cm.StateSIDRREQRcvd, evs[0].ID.State())

	// A retransmitted SIDR_REQ while the answer is pending is dropped.
	got = l.advance(4096 * time.Millisecond)
	require.Equal(t, []string{"A:SIDR_REQ"}, attrs(got))
	require.Empty(t, l.b.events)
	require.Equal(t, uint64(1), l.b.m.Counters()["rx_dup_sidr_req"])

	require.NoError(t, evs[0].ID.SIDRReply(cm.SIDRReplyParams{Status: mad.SIDRSuccess, QPN: 0x33, QKey: 0x01234567}))
	got = l.pump()
	require.Equal(t, []string{"B:SIDR_REP"}, attrs(got))
	require.Equal(t, got[0].hdr.TID, l.sent[0].hdr.TID)
	require.Len(t, l.a.sidr, 1)
	res := l.a.sidr[0]
	require.NoError(t, res.Err)
	require.Equal(t, mad.SIDRSuccess, res.Status)
	require.Equal(t, uint32(0x33), res.QPN)
	require.Equal(t, uint32(0x01234567), res.QKey)
	require.Equal(t, uint64(udpService), res.ServiceID)
	require.Equal(t, 0, l.clock.Pending())
	require.ErrorIs(t, evs[0].ID.SIDRReply(cm.SIDRReplyParams{}), cm.ErrState)
	for _, m := range []*cm.Manager{l.a.m, l.b.m} {
		ids, _, _, sidr, _ := m.TableSizes()
		require.Zero(t, ids+sidr)
	}
}

func TestSIDRNoListener(t *testing.T) {
	l := newLink(t, nil)
	require.NoError(t, queried(l.a.m.SIDRQuery(cm.SIDRParams{Src: gidA, Dst: gidB, ServiceID: udpService}, l.a.sidrHandler())))
	got := l.pump()
	require.Equal(t, []string{"A:SIDR_REQ", "B:SIDR_REP"}, attrs(got))
	require.Len(t, l.a.sidr, 1)
	require.NoError(t, l.a.sidr[0].Err)
	require.Equal(t, mad.SIDRUnsupported, l.a.sidr[0].Status)
	require.Equal(t, uint64(1), l.b.m.Counters()["rej_invalid_service_id"])
}

func TestSIDRTimeout(t *testing.T) {
	l := newLink(t, nil)
	l.drop = func(packet) bool { return true }
	require.NoError(t, queried(l.a.m.SIDRQuery(cm.SIDRParams{Src: gidA, Dst: gidB, ServiceID: udpService,
		Timeout: 100 * time.Millisecond, MaxCMRetries: 2}, l.a.sidrHandler())))
	l.pump()
	l.advance(200 * time.Millisecond)
	require.Empty(t, l.a.sidr)
	l.advance(100 * time.Millisecond)
	require.Len(t, l.a.sidr, 1)
	require.ErrorIs(t, l.a.sidr[0].Err, cm.ErrTimeout)
	require.Len(t, l.sent, 3)
}

// Destroying a pending SIDR ID answers REJECT, as cm_destroy_id.
func TestSIDRDestroyRejects(t *testing.T) {
	l := newLink(t, nil)
	_, err := l.b.m.Listen(udpService, 0, l.b.handler())
	require.NoError(t, err)
	require.NoError(t, queried(l.a.m.SIDRQuery(cm.SIDRParams{Src: gidA, Dst: gidB, ServiceID: udpService}, l.a.sidrHandler())))
	l.pump()
	l.b.take()[0].ID.Destroy()
	l.pump()
	require.Len(t, l.a.sidr, 1)
	require.Equal(t, mad.SIDRReject, l.a.sidr[0].Status)
}

// A duplicate of an answered SIDR_REQ (a network copy, or the requester's
// retry after the SIDR_REP was lost) gets the same SIDR_REP again, not a
// new request for the listener. A udaddy server given a late duplicate
// as a second request sets up a second QP, the client may take that
// answer, and the server's first QP waits for datagrams that never come:
// the likely cause of one TestUdaddyMatchesRdmaCoreOutput/dup_reorder
// failure under load ("connection 0 receives: 0 of 20"). After
// sidrAnswerWindow the request is forgotten.
func TestSIDRDuplicateAfterReplyGetsTheSameAnswer(t *testing.T) {
	l := newLink(t, nil)
	_, err := l.b.m.Listen(udpService, 0, l.b.handler())
	require.NoError(t, err)
	require.NoError(t, queried(l.a.m.SIDRQuery(cm.SIDRParams{Src: gidA, Dst: gidB, ServiceID: udpService}, l.a.sidrHandler())))
	got := l.pump()
	require.Equal(t, []string{"A:SIDR_REQ"}, attrs(got))
	req := got[0]
	evs := l.b.take()
	require.Equal(t, []cm.EventType{cm.EventSIDRREQ}, types(evs))
	require.NoError(t, evs[0].ID.SIDRReply(cm.SIDRReplyParams{Status: mad.SIDRSuccess, QPN: 0x33, QKey: 0x01234567}))
	got = l.pump()
	require.Equal(t, []string{"B:SIDR_REP"}, attrs(got))
	first := got[0].b

	dup := func() []packet {
		l.b.m.HandleMAD(req.src, req.dst, bytes.Clone(req.b))
		return l.pump()
	}
	got = dup()
	require.Equal(t, []string{"B:SIDR_REP"}, attrs(got), "the duplicate is answered")
	require.Equal(t, first, got[0].b, "with the same SIDR_REP")
	require.Empty(t, l.b.take(), "and never reaches the listener")
	require.Equal(t, uint64(1), l.b.m.Counters()["rx_dup_sidr_req"])
	require.Equal(t, uint64(2), l.b.m.Counters()["tx_sidr_rep"])
	require.Len(t, l.a.sidr, 1, "the requester took one answer (the second is for a finished query)")
	require.Equal(t, 0, l.clock.Pending(), "no timer is kept for it")

	// Past the window the request is new again (as cm.c takes every
	// answered one).
	l.clock.Advance(time.Minute)
	got = dup()
	require.Empty(t, attrs(got))
	evs = l.b.take()
	require.Equal(t, []cm.EventType{cm.EventSIDRREQ}, types(evs))
	require.NoError(t, evs[0].ID.SIDRReply(cm.SIDRReplyParams{Status: mad.SIDRReject}))
	require.Equal(t, []string{"B:SIDR_REP"}, attrs(l.pump()))
}

// queried is SIDRQuery's error (its ID unused).
func queried(_ *cm.ID, err error) error { return err }

// TestSIDRQueryDestroyedIsAbandoned: destroying a query's ID stops its
// retransmissions and its handler is never called, as ib_destroy_cm_id
// cancels the kernel's. rdmacm's DialUD relies on it (session AF: before,
// SIDRQuery returned no ID, so a DialUD whose context ended went on
// sending SIDR_REQs for its 16 tries, about a minute).
func TestSIDRQueryDestroyedIsAbandoned(t *testing.T) {
	l := newLink(t, nil)
	l.drop = func(packet) bool { return true }
	id, err := l.a.m.SIDRQuery(cm.SIDRParams{Src: gidA, Dst: gidB, ServiceID: udpService,
		Timeout: 100 * time.Millisecond, MaxCMRetries: 2}, l.a.sidrHandler())
	require.NoError(t, err)
	l.pump()
	require.Equal(t, uint64(1), l.a.m.Counters()["tx_sidr_req"], "the first SIDR_REQ")
	id.Destroy()
	l.advance(time.Second)
	l.pump()
	require.Zero(t, l.a.m.Counters()["tx_retries_sidr_req"], "no retransmission after the destroy")
	require.Empty(t, l.a.sidr, "nor a call of the handler")
	ids, _, _, _, _ := l.a.m.TableSizes()
	require.Zero(t, ids)
}
