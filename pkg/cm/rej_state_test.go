package cm_test

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestREJCommIDsByState: a REJ carries what cm_format_rej puts in it for
// the state its sender rejects from (kernel 6.1, cm.c): local comm ID 0
// and "REQ rejected" from REQ_RCVD; our comm ID and "REQ" from
// MRA_REQ_SENT; our comm ID and "REP" from REP_RCVD / MRA_REP_SENT; our
// comm ID and "other" from every other state (REQ_SENT and MRA_REQ_RCVD on
// the active side, with reason timeout and our CA GUID as ARI when the ID
// is destroyed; REP_SENT and MRA_REP_RCVD on the passive side). The
// remote comm ID is the peer's as we know it (0 before the REP), the TID
// the REQ's. Each REJ finds the peer's ID, which reports EventREJ: a REJ
// for a REQ by its remote comm ID alone, whatever its local one
// (cm_acquire_rejected_id).
//
// Bug (CM task, session AG): the passive ID entered MRA_REQ_SENT before
// its EventREQ handler ran, where rdma_cm arms the delayed MRA only after
// its handler has returned, so a REQ refused from inside the handler (no
// listener on the REQ's address, a bad rdma_cm header) got a REJ naming
// our local comm ID where the kernel's names 0.
func TestREJCommIDsByState(t *testing.T) {
	consumer := mad.REJConsumerDefined
	for _, tc := range []struct {
		name string
		// run drives l to the REJ and returns the sender's and the
		// receiver's IDs.
		run       func(t *testing.T, l *link) (from, to *cm.ID)
		state     cm.State // the sender's, when it rejects
		localZero bool
		msg       uint8
		reason    mad.REJReason
		ari       bool // ARI = the sender's CA GUID
	}{
		{name: "passive REQ_RCVD, Reject in the REQ handler", state: cm.StateREQRcvd,
			localZero: true, msg: mad.REJMsgREQ, reason: consumer,
			run: func(t *testing.T, l *link) (*cm.ID, *cm.ID) {
				var st cm.State
				l.b.react = func(ev cm.Event) {
					if ev.Type == cm.EventREQ {
						st = ev.ID.State()
						require.NoError(t, ev.ID.Reject(consumer, nil, nil))
					}
				}
				ida, idb := l.reqDelivered(t)
				require.Equal(t, cm.StateREQRcvd, st)
				return idb, ida
			}},
		{name: "passive REQ_RCVD, Destroy in the REQ handler", state: cm.StateREQRcvd,
			localZero: true, msg: mad.REJMsgREQ, reason: consumer,
			run: func(t *testing.T, l *link) (*cm.ID, *cm.ID) {
				l.b.react = func(ev cm.Event) {
					if ev.Type == cm.EventREQ {
						ev.ID.Destroy()
					}
				}
				ida, idb := l.reqDelivered(t)
				return idb, ida
			}},
		{name: "passive MRA_REQ_SENT, PrepareMRA then Reject in the handler", state: cm.StateMRAREQSent,
			msg: mad.REJMsgREQ, reason: consumer,
			run: func(t *testing.T, l *link) (*cm.ID, *cm.ID) {
				l.b.react = func(ev cm.Event) {
					if ev.Type == cm.EventREQ {
						require.NoError(t, ev.ID.PrepareMRA())
						require.Equal(t, cm.StateMRAREQSent, ev.ID.State())
						require.NoError(t, ev.ID.Reject(consumer, nil, nil))
					}
				}
				ida, idb := l.reqDelivered(t)
				return idb, ida
			}},
		{name: "passive MRA_REQ_SENT, Reject after the handler", state: cm.StateMRAREQSent,
			msg: mad.REJMsgREQ, reason: consumer,
			run: func(t *testing.T, l *link) (*cm.ID, *cm.ID) {
				ida, idb := l.reqDelivered(t)
				require.Equal(t, cm.StateMRAREQSent, idb.State(), "the delayed MRA is armed once the handler returned")
				require.NoError(t, idb.Reject(consumer, nil, nil))
				return idb, ida
			}},
		{name: "passive REP_SENT", state: cm.StateREPSent, msg: mad.REJMsgOther, reason: consumer,
			run: func(t *testing.T, l *link) (*cm.ID, *cm.ID) {
				ida, idb := l.reqDelivered(t)
				require.NoError(t, idb.Accept(acceptParams(0x22)))
				l.pump()
				require.Equal(t, cm.StateREPSent, idb.State())
				require.NoError(t, idb.Reject(consumer, nil, nil))
				return idb, ida
			}},
		{name: "passive MRA_REP_RCVD", state: cm.StateMRAREPRcvd, msg: mad.REJMsgOther, reason: consumer,
			run: func(t *testing.T, l *link) (*cm.ID, *cm.ID) {
				ida, idb := l.reqDelivered(t)
				// A duplicate of the REP before A answers draws A's MRA.
				l.a.react = func(ev cm.Event) {
					if ev.Type == cm.EventREP {
						rep := l.sent[len(l.sent)-1]
						l.a.m.HandleMAD(rep.src, rep.dst, rep.b)
					}
				}
				require.NoError(t, idb.Accept(acceptParams(0x22)))
				l.pump()
				require.Equal(t, cm.StateMRAREPRcvd, idb.State())
				require.NoError(t, idb.Reject(consumer, nil, nil))
				return idb, ida
			}},
		{name: "active REQ_SENT, Destroy", state: cm.StateREQSent, msg: mad.REJMsgOther,
			reason: mad.REJTimeout, ari: true,
			run: func(t *testing.T, l *link) (*cm.ID, *cm.ID) {
				ida, idb := l.reqDelivered(t)
				require.Equal(t, cm.StateREQSent, ida.State())
				ida.Destroy()
				return ida, idb
			}},
		{name: "active MRA_REQ_RCVD, Destroy", state: cm.StateMRAREQRcvd, msg: mad.REJMsgOther,
			reason: mad.REJTimeout, ari: true,
			run: func(t *testing.T, l *link) (*cm.ID, *cm.ID) {
				ida, idb := l.reqDelivered(t)
				req := l.sent[0]
				l.b.m.HandleMAD(req.src, req.dst, req.b) // a duplicate draws B's MRA
				require.Equal(t, []string{"B:MRA"}, attrs(l.pump()))
				require.Equal(t, cm.StateMRAREQRcvd, ida.State())
				l.a.take()
				ida.Destroy()
				return ida, idb
			}},
		{name: "active MRA_REP_SENT, Reject", state: cm.StateMRAREPSent, msg: mad.REJMsgREP, reason: consumer,
			run: func(t *testing.T, l *link) (*cm.ID, *cm.ID) {
				ida, idb := l.reqDelivered(t)
				require.NoError(t, idb.Accept(acceptParams(0x22)))
				l.pump()
				require.Equal(t, cm.StateMRAREPSent, ida.State())
				l.a.take()
				require.NoError(t, ida.Reject(consumer, nil, nil))
				return ida, idb
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLink(t, nil)
			l.listen()
			from, to := tc.run(t, l)
			sender := l.a
			if from.Passive() {
				sender = l.b
			}
			l.pump()
			var rejs []packet
			for _, p := range l.sent {
				if p.hdr.AttrID == mad.AttrREJ {
					rejs = append(rejs, p)
				}
			}
			require.Len(t, rejs, 1, "one REJ: %v", attrs(l.sent))
			require.Equal(t, sender.name+":REJ", attrs(rejs)[0])
			rej := rejs[0].msg.(*mad.REJ)
			if tc.localZero {
				require.Zero(t, rej.LocalCommID, "cm_format_rej in %v: local comm ID 0", tc.state)
			} else {
				require.Equal(t, from.LocalCommID(), rej.LocalCommID, "cm_format_rej in %v: our comm ID", tc.state)
			}
			require.Equal(t, from.RemoteCommID(), rej.RemoteCommID)
			require.Equal(t, tc.msg, rej.MessageRejected)
			require.Equal(t, tc.reason, rej.Reason)
			if tc.ari {
				require.Len(t, rej.ARI, 8)
				require.Equal(t, sender.guid, binary.BigEndian.Uint64(rej.ARI))
			}
			require.Equal(t, l.sent[0].hdr.TID, rejs[0].hdr.TID, "the REQ's TID")

			// The REJ found the peer's ID.
			receiver := l.a
			if to.Passive() {
				receiver = l.b
			}
			evs := receiver.take()
			require.NotEmpty(t, evs)
			last := evs[len(evs)-1]
			require.Equal(t, cm.EventREJ, last.Type, "the REJ reaches the peer's ID: %v", types(evs))
			require.Equal(t, tc.reason, last.Reason)
			require.Same(t, to, last.ID)
			require.Zero(t, receiver.m.Counters()["rx_unknown_comm_id"])
		})
	}
}

// TestTimeoutsSendNoREJ: a REQ or REP that runs out of retries ends its ID
// without a REJ, as cm_process_send_error does (rdma_cm reports
// UNREACHABLE; the REJ of a destroyed ID is Destroy's).
func TestTimeoutsSendNoREJ(t *testing.T) {
	t.Run("REQ", func(t *testing.T) {
		l := newLink(t, nil)
		l.drop = func(packet) bool { return true }
		ida, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
		require.NoError(t, err)
		l.pump()
		l.advance(time.Hour)
		require.Equal(t, []cm.EventType{cm.EventTimeout}, types(l.a.take()))
		require.Equal(t, cm.StateIdle, ida.State())
		for _, p := range l.sent {
			require.NotEqual(t, uint16(mad.AttrREJ), p.hdr.AttrID)
		}
	})
	t.Run("REP", func(t *testing.T) {
		l := newLink(t, nil)
		l.listen()
		_, idb := l.reqDelivered(t)
		l.drop = func(packet) bool { return true }
		require.NoError(t, idb.Accept(acceptParams(0x22)))
		l.pump()
		l.advance(time.Hour)
		require.Equal(t, []cm.EventType{cm.EventTimeout}, types(l.b.take()))
		require.Equal(t, cm.StateIdle, idb.State())
		for _, p := range l.sent {
			require.NotEqual(t, uint16(mad.AttrREJ), p.hdr.AttrID)
		}
	})
}

// reqDelivered has A connect and delivers the REQ to B; it returns both
// IDs, B's REQ event consumed.
func (l *link) reqDelivered(t *testing.T) (ida, idb *cm.ID) {
	t.Helper()
	ida, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
	require.NoError(t, err)
	require.Equal(t, []string{"A:REQ"}, attrs(l.pump()[:1]))
	evs := l.b.take()
	require.NotEmpty(t, evs)
	require.Equal(t, cm.EventREQ, evs[0].Type)
	return ida, evs[0].ID
}
