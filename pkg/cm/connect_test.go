package cm_test

import (
	"bytes"
	"testing"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

func TestConnectAcceptRTUEstablished(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	ida, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
	require.NoError(t, err)
	require.Equal(t, cm.StateREQSent, ida.State())

	got := l.pump()
	require.Equal(t, []string{"A:REQ"}, attrs(got))
	req := got[0].msg.(*mad.REQ)
	require.Equal(t, ida.LocalCommID(), req.LocalCommID)
	require.Equal(t, uint64(serviceID), req.ServiceID)
	require.Equal(t, uint64(guidA), req.LocalCAGUID)
	require.Equal(t, uint32(0x11), req.LocalQPN)
	require.Equal(t, uint32(0x123456), req.StartingPSN)
	require.Equal(t, uint8(20), req.RemoteCMResponseTimeout)
	require.Equal(t, uint8(15), req.MaxCMRetries)
	require.Equal(t, uint16(0xFFFF), req.PKey)
	// cm_ack_timeout(15, 16) = 17; routed RoCE: permissive LIDs.
	require.Equal(t, uint8(17), req.Primary.LocalACKTimeout)
	require.Equal(t, uint16(0xFFFF), req.Primary.LocalLID)
	require.Equal(t, gidA, req.Primary.LocalGID)
	require.Equal(t, gidB, req.Primary.RemoteGID)
	// TID = hi_tid << 32 | local comm ID.
	require.Equal(t, uint64(ida.LocalCommID()), got[0].hdr.TID&0xFFFFFFFF)
	require.NotZero(t, got[0].hdr.TID>>32)

	evs := l.b.take()
	require.Equal(t, []cm.EventType{cm.EventREQ}, types(evs))
	idb := evs[0].ID
	require.True(t, idb.Passive())
	require.Equal(t, req.LocalCommID, idb.RemoteCommID())
	require.Equal(t, uint32(0x11), idb.RemoteQPN())
	require.Equal(t, uint64(guidA), idb.RemoteCAGUID())
	require.Equal(t, gidA, idb.RemoteAddr())
	require.Equal(t, gidB, idb.LocalAddr())
	require.True(t, bytes.HasPrefix(evs[0].PrivateData, []byte("hello from A")))
	require.Equal(t, cm.StateMRAREQSent, idb.State(), "delayed MRA armed, as rdma_cm")

	require.NoError(t, idb.Accept(acceptParams(0x22)))
	require.Equal(t, cm.StateREPSent, idb.State())
	got = l.pump()
	require.Equal(t, []string{"B:REP"}, attrs(got))
	rep := got[0].msg.(*mad.REP)
	require.Equal(t, got[0].hdr.TID, l.sent[0].hdr.TID, "REP reuses the REQ's TID")
	require.Equal(t, idb.LocalCommID(), rep.LocalCommID)
	require.Equal(t, ida.LocalCommID(), rep.RemoteCommID)
	require.Equal(t, uint32(0x22), rep.LocalQPN)
	require.Equal(t, uint8(15), rep.TargetACKDelay)

	evs = l.a.take()
	require.Equal(t, []cm.EventType{cm.EventREP}, types(evs))
	require.Equal(t, uint32(0x654321), evs[0].REP.StartingPSN)
	require.True(t, bytes.HasPrefix(evs[0].PrivateData, []byte("welcome")))
	require.Equal(t, cm.StateMRAREPSent, ida.State())

	require.NoError(t, ida.SendRTU([]byte("rtu")))
	got = l.pump()
	require.Equal(t, []string{"A:RTU"}, attrs(got))
	require.Equal(t, l.sent[0].hdr.TID, got[0].hdr.TID)
	require.Equal(t, []cm.EventType{cm.EventEstablished}, types(l.a.take()))
	evs = l.b.take()
	require.Equal(t, []cm.EventType{cm.EventEstablished}, types(evs))
	require.True(t, bytes.HasPrefix(evs[0].PrivateData, []byte("rtu")))
	require.Equal(t, cm.StateEstablished, ida.State())
	require.Equal(t, cm.StateEstablished, idb.State())
	require.Equal(t, 0, l.clock.Pending(), "no timer left once established")

	// Calls in the wrong state fail.
	require.ErrorIs(t, ida.SendRTU(nil), cm.ErrState)
	require.ErrorIs(t, idb.Accept(acceptParams(0x22)), cm.ErrState)
	require.ErrorIs(t, idb.Established(), cm.ErrAlreadyEstablished, "already established: cm_establish's -EISCONN")
	require.ErrorIs(t, ida.Established(), cm.ErrAlreadyEstablished, "cm_establish asks no side")

	ca, cb := l.a.m.Counters(), l.b.m.Counters()
	require.Equal(t, uint64(1), ca["tx_req"])
	require.Equal(t, uint64(1), ca["rx_rep"])
	require.Equal(t, uint64(1), ca["tx_rtu"])
	require.Equal(t, uint64(1), cb["rx_req"])
	require.Equal(t, uint64(1), cb["tx_rep"])
	require.Equal(t, uint64(1), cb["rx_rtu"])
}

func TestAutoRTU(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	p := l.connectParams(0x11)
	p.AutoRTU = true
	ida, err := l.a.m.Connect(p, l.a.handler())
	require.NoError(t, err)
	l.pump()
	require.NoError(t, l.b.take()[0].ID.Accept(acceptParams(0x22)))
	require.Equal(t, []string{"B:REP", "A:RTU"}, attrs(l.pump()))
	require.Equal(t, []cm.EventType{cm.EventREP, cm.EventEstablished}, types(l.a.take()))
	require.Equal(t, []cm.EventType{cm.EventEstablished}, types(l.b.take()))
	require.Equal(t, cm.StateEstablished, ida.State())
}

// The handler may answer from inside the event: the REP goes out after it
// returns, in order.
func TestAcceptFromHandler(t *testing.T) {
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
	_, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
	require.NoError(t, err)
	require.Equal(t, []string{"A:REQ", "B:REP", "A:RTU"}, attrs(l.pump()))
	require.Equal(t, []cm.EventType{cm.EventREP, cm.EventEstablished}, types(l.a.take()))
	require.Equal(t, []cm.EventType{cm.EventREQ, cm.EventEstablished}, types(l.b.take()))
}

func TestRejectByConsumerPassesPrivateData(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	ida, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
	require.NoError(t, err)
	l.pump()
	idb := l.b.take()[0].ID
	require.NoError(t, idb.Reject(mad.REJConsumerDefined, nil, []byte("go away")))
	got := l.pump()
	require.Equal(t, []string{"B:REJ"}, attrs(got))
	rej := got[0].msg.(*mad.REJ)
	require.Equal(t, uint8(mad.REJMsgREQ), rej.MessageRejected)
	require.Equal(t, idb.LocalCommID(), rej.LocalCommID, "MRA_REQ_SENT: cm_format_rej names our comm ID")
	require.Equal(t, ida.LocalCommID(), rej.RemoteCommID)
	require.Equal(t, l.sent[0].hdr.TID, got[0].hdr.TID)

	evs := l.a.take()
	require.Equal(t, []cm.EventType{cm.EventREJ}, types(evs))
	require.Equal(t, mad.REJConsumerDefined, evs[0].Reason)
	require.True(t, bytes.HasPrefix(evs[0].PrivateData, []byte("go away")))
	require.Equal(t, cm.StateIdle, ida.State())
	require.Equal(t, cm.StateIdle, idb.State())
	require.Equal(t, 0, l.clock.Pending(), "the REQ's retransmission stopped")
	for _, m := range []*cm.Manager{l.a.m, l.b.m} {
		ids, rids, rqps, _, _ := m.TableSizes()
		require.Zero(t, ids+rids+rqps)
	}
	require.ErrorIs(t, idb.Accept(acceptParams(1)), cm.ErrState)
}

// The active side may refuse the REP: the passive side sees the REJ in
// REP_SENT and its REP stops.
func TestRejectREP(t *testing.T) {
	l := newLink(t, nil)
	l.listen()
	ida, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
	require.NoError(t, err)
	l.pump()
	idb := l.b.take()[0].ID
	require.NoError(t, idb.Accept(acceptParams(0x22)))
	l.pump()
	l.a.take()
	require.NoError(t, ida.Reject(mad.REJConsumerDefined, nil, nil))
	got := l.pump()
	require.Equal(t, []string{"A:REJ"}, attrs(got))
	require.Equal(t, uint8(mad.REJMsgREP), got[0].msg.(*mad.REJ).MessageRejected)
	evs := l.b.take()
	require.Equal(t, []cm.EventType{cm.EventREJ}, types(evs))
	require.Equal(t, cm.StateIdle, idb.State())
	require.Equal(t, cm.StateIdle, ida.State())
}

func TestREQNoListenerREJ8(t *testing.T) {
	l := newLink(t, nil)
	ida, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
	require.NoError(t, err)
	got := l.pump()
	require.Equal(t, []string{"A:REQ", "B:REJ"}, attrs(got))
	rej := got[1].msg.(*mad.REJ)
	require.Equal(t, mad.REJInvalidServiceID, rej.Reason)
	require.Zero(t, rej.LocalCommID, "cm_issue_rej: no local comm ID")
	require.Equal(t, ida.LocalCommID(), rej.RemoteCommID)
	require.Equal(t, got[0].hdr.TID, got[1].hdr.TID, "TID echoed")
	require.Equal(t, uint8(mad.REJMsgREQ), rej.MessageRejected)
	evs := l.a.take()
	require.Equal(t, []cm.EventType{cm.EventREJ}, types(evs))
	require.Equal(t, mad.REJInvalidServiceID, evs[0].Reason)
	require.Equal(t, uint64(1), l.b.m.Counters()["rej_invalid_service_id"])
	require.Empty(t, l.b.events)
	require.Equal(t, 0, l.clock.Pending())
}

func TestListenMaskAndOverlap(t *testing.T) {
	l := newLink(t, nil)
	// Every port of RDMA_PS_TCP.
	ln, err := l.b.m.Listen(0x0106_0000, 0xFFFF_FFFF_FFFF_0000, l.b.handler())
	require.NoError(t, err)
	_, err = l.b.m.Listen(serviceID, 0, l.b.handler())
	require.ErrorIs(t, err, cm.ErrBusy)
	_, err = l.a.m.Connect(l.connectParams(0x11), l.a.handler())
	require.NoError(t, err)
	l.pump()
	require.Equal(t, []cm.EventType{cm.EventREQ}, types(l.b.take()))
	require.NoError(t, ln.Close())
	_, err = l.a.m.Connect(l.connectParams(0x12), l.a.handler())
	require.NoError(t, err)
	require.Equal(t, []string{"A:REQ", "B:REJ"}, attrs(l.pump()))
}

func TestConnectInvalidParams(t *testing.T) {
	l := newLink(t, nil)
	p := l.connectParams(0x11)
	p.PrivateData = make([]byte, mad.REQPrivateLen+1)
	_, err := l.a.m.Connect(p, nil)
	require.ErrorIs(t, err, cm.ErrInvalid)
	p = l.connectParams(1 << 24)
	_, err = l.a.m.Connect(p, nil)
	require.ErrorIs(t, err, cm.ErrInvalid)
	require.Empty(t, l.sent)
	ids, _, _, _, _ := l.a.m.TableSizes()
	require.Zero(t, ids)
}
