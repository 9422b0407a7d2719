package qp

import (
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// newGSIEnd is QP1 in RTS (the GSI transitions: no port, Q_Key required
// at INIT and ignored).
func newGSIEnd(l *link, addr string) *end {
	t := l.t
	t.Helper()
	e := newEnd(t, GSI, 1, addr)
	require.NoError(t, e.q.Modify(&Attr{State: Init, QKey: 0x1234}, AttrState|AttrPKeyIndex|AttrQKey, l.now))
	require.NoError(t, e.q.Modify(&Attr{State: RTR}, AttrState, l.now))
	require.NoError(t, e.q.Modify(&Attr{State: RTS}, AttrState|AttrSQPSN, l.now))
	return e
}

// QP1 sends the GSI Q_Key whatever Q_Key its WR names, as rxe's
// init_req_packet (`qp_num == 1 ? GSI_QKEY : remote_qkey`): a GSI peer
// drops any other Q_Key, so the MAD would be lost. rxed sent the WR's
// Q_Key when its high bit was clear (the audit of UD against rxe 6.1,
// area e).
func TestGSISendsTheGSIQKeyWhateverTheWRNames(t *testing.T) {
	l := &link{t: t, now: time.Unix(1000, 0)}
	a := newGSIEnd(l, "10.0.0.1")
	l.a = a
	for _, wrQKey := range []uint32{GSIQKey, 0x1234, 0x80000000, 0} {
		l.post(SendWR{ID: 1, Opcode: WRSend, SGL: []SGE{a.sge(0, 256)},
			AV: AddrVector{DGID: a.addr.Addr()}, RemoteQPN: 1, RemoteQKey: wrQKey})
		pk := a.env.take()
		require.Len(t, pk, 1)
		var p wire.Packet
		require.NoError(t, p.Parse(pk[0]))
		require.Equal(t, uint32(GSIQKey), p.DETH.QKey(), "WR Q_Key %#x", wrQKey)
		require.Equal(t, uint32(1), p.DETH.SrcQP())
	}
}
