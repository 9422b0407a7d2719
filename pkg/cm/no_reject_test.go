package cm_test

import (
	"testing"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestDestroyNoRejectLetsTheREQRetry: an ID destroyed with DestroyNoReject
// from its EventREQ handler (REQ_RCVD: rdma_cm's full backlog, whose
// handler fails with -ENOMEM) sends no REJ and leaves nothing behind, as
// cm_destroy_id's cm_reset_to_idle ("do not reject to allow future
// retries"): no ID, no (GUID, comm ID) entry that would make the peer's
// retransmitted REQ a duplicate, no (GUID, QPN) entry that would make it
// stale. The retransmission, once the REQ's timer runs out, is a new
// request: a new EventREQ, and the connection completes. Once the delayed
// MRA is armed (after the handler), DestroyNoReject is Destroy: a REJ.
//
// Bug (CM follow-up, full backlog): rdma_cm answered a REQ beyond its backlog
// with REJ 28, which ends the peer's connect, where the kernel stays
// silent and takes the REQ's retransmission once there is room.
func TestDestroyNoRejectLetsTheREQRetry(t *testing.T) {
	t.Run("REQ_RCVD: no REJ, the retransmission is new", func(t *testing.T) {
		l := newLink(t, nil)
		l.listen()
		var first *cm.ID
		var inHandler cm.State
		l.b.react = func(ev cm.Event) {
			if ev.Type == cm.EventREQ && first == nil {
				first = ev.ID
				inHandler = ev.ID.State()
				ev.ID.DestroyNoReject()
			}
		}
		ida, err := l.a.m.Connect(l.connectParams(0x11), l.a.handler())
		require.NoError(t, err)
		require.Equal(t, []string{"A:REQ"}, attrs(l.pump()))
		require.Equal(t, cm.StateREQRcvd, inHandler)
		require.Equal(t, cm.StateIdle, first.State())
		ids, remoteIDs, remoteQPs, _, _ := l.b.m.TableSizes()
		require.Zero(t, ids+remoteIDs+remoteQPs, "the dropped REQ left no ID (%d), comm ID entry (%d) or QPN entry (%d)",
			ids, remoteIDs, remoteQPs)
		require.Equal(t, uint64(1), l.b.m.Counters()["req_dropped"])
		require.Empty(t, l.a.take(), "the active side heard nothing")
		require.Equal(t, cm.StateREQSent, ida.State())

		// The REQ's retransmission: a new request.
		require.Equal(t, []string{"A:REQ"}, attrs(l.advance(reqTimeout)))
		evs := l.b.take()
		require.Equal(t, []cm.EventType{cm.EventREQ, cm.EventREQ}, types(evs), "the first REQ's event, then the new one")
		idb := evs[1].ID
		require.NotSame(t, first, idb)
		require.Equal(t, cm.StateMRAREQSent, idb.State())
		require.Equal(t, ida.LocalCommID(), idb.RemoteCommID())
		c := l.b.m.Counters()
		require.Zero(t, c["rx_dup_req"], "not a duplicate")
		require.Zero(t, c["rej_stale_conn"], "not stale")
		require.Zero(t, c["tx_rej"])

		require.NoError(t, idb.Accept(acceptParams(0x22)))
		require.Equal(t, []string{"B:REP"}, attrs(l.pump()))
		require.Equal(t, []cm.EventType{cm.EventREP}, types(l.a.take()))
		require.NoError(t, ida.SendRTU(nil))
		l.pump()
		require.Equal(t, cm.StateEstablished, ida.State())
		require.Equal(t, cm.StateEstablished, idb.State())
		for _, p := range l.sent {
			require.NotEqual(t, uint16(mad.AttrREJ), p.hdr.AttrID, "no REJ at all: %v", attrs(l.sent))
		}
	})
	t.Run("MRA_REQ_SENT: a REJ, as Destroy", func(t *testing.T) {
		l := newLink(t, nil)
		l.listen()
		ida, idb := l.reqDelivered(t)
		require.Equal(t, cm.StateMRAREQSent, idb.State())
		idb.DestroyNoReject()
		require.Equal(t, []string{"B:REJ"}, attrs(l.pump()))
		rej := l.sent[len(l.sent)-1].msg.(*mad.REJ)
		require.Equal(t, mad.REJConsumerDefined, rej.Reason)
		require.Equal(t, []cm.EventType{cm.EventREJ}, types(l.a.take()))
		require.Equal(t, cm.StateIdle, ida.State())
		require.Zero(t, l.b.m.Counters()["req_dropped"])
	})
}
