package cm_test

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestIssueREJEchoesREQBytes4To7: the REJ refusing a REQ that gets no ID
// (no listener, a stale connection, no resources) carries the REQ's data
// bytes 4-7 as its local comm ID and the REQ's local comm ID as its
// remote one, with the REQ's TID, as cm.c's cm_issue_rej builds it: it
// reads the received message through the REJ's layout and swaps the two
// words (rej->local_comm_id = rcv->remote_comm_id), whatever the message,
// and a REQ's bytes 4-7 are reserved(8) and the vendor ID(24) (an ECE
// REQ sets the vendor ID). rdma_cm leaves them zero, hence the 0 in
// frame 2 of shared/pcaps' rdmacm_rej_no_listener (the REQ's bytes 4-7
// are zero too).
//
// Bug (CM follow-up, cm_issue_rej): rxed always put 0.
func TestIssueREJEchoesREQBytes4To7(t *testing.T) {
	const activeQPN = 0x11
	scenarios := []struct {
		name   string
		reason mad.REJReason
		// setup readies B so that a REQ from A on QPN activeQPN (a new
		// comm ID) gets no ID.
		setup func(t *testing.T, l *link)
		cfg   func(*cm.Config)
	}{
		{name: "no listener", reason: mad.REJInvalidServiceID, setup: func(*testing.T, *link) {}},
		{name: "stale connection", reason: mad.REJStaleConn, setup: func(t *testing.T, l *link) {
			l.listen()
			l.established(activeQPN, 0x22)
		}},
		{name: "no resources", reason: mad.REJNoResources, cfg: func(c *cm.Config) { c.MaxHalfOpen = 1 },
			setup: func(t *testing.T, l *link) {
				l.listen()
				ida, err := l.a.m.Connect(l.connectParams(0x33), l.a.handler())
				require.NoError(t, err)
				l.pump()
				require.Equal(t, cm.StateREQSent, ida.State(), "the first REQ waits for B's answer")
			}},
	}
	for _, sc := range scenarios {
		for _, w := range []uint32{0, 0x00AB_CDEF, 0xFF00_0000, 0xFFFF_FFFF} {
			t.Run(fmt.Sprintf("%s/bytes 4-7 %#08x", sc.name, w), func(t *testing.T) {
				l := newLink(t, sc.cfg)
				sc.setup(t, l)
				before := len(l.sent)
				const tid, commID = 0x0000_0002_5A49_AF74, 0x74AF_495A
				req := &mad.REQ{
					LocalCommID: commID, ServiceID: serviceID, LocalCAGUID: guidA,
					LocalQPN: activeQPN, StartingPSN: 1, LocalCMResponseTimeout: 20,
					RemoteCMResponseTimeout: 20, MaxCMRetries: 15, PKey: 0xFFFF, PathMTU: 3,
					Primary: mad.Path{LocalGID: gidA, RemoteGID: gidB, LocalACKTimeout: 17},
				}
				b, err := mad.Marshal(tid, req)
				require.NoError(t, err)
				binary.BigEndian.PutUint32(b[mad.HeaderLen+4:], w)
				_, parsed, err := mad.Parse(b)
				require.NoError(t, err, "a REQ with bytes 4-7 %#08x is valid", w)
				require.Equal(t, w&0xFF_FFFF, parsed.(*mad.REQ).VendorID)

				l.b.m.HandleMAD(gidA, gidB, b)
				var rejs []packet
				for _, p := range l.sent[before:] {
					if p.from == l.b && p.hdr.AttrID == mad.AttrREJ {
						rejs = append(rejs, p)
					}
				}
				require.Len(t, rejs, 1, "B's answer: %v", attrs(l.sent[before:]))
				rej := rejs[0].msg.(*mad.REJ)
				require.Equal(t, sc.reason, rej.Reason)
				require.Equal(t, w, rej.LocalCommID, "the REQ's bytes 4-7")
				require.Equal(t, uint32(commID), rej.RemoteCommID, "the REQ's local comm ID")
				require.Equal(t, uint8(mad.REJMsgREQ), rej.MessageRejected)
				require.Equal(t, uint64(tid), rejs[0].hdr.TID)
				require.Equal(t, gidA, rejs[0].dst)
			})
		}
	}
}
