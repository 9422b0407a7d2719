package qp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Every successful receive completion carries IBV_WC_GRH, whatever the
// QP type, as rdma_rxe reports it: do_complete starts a user CQE's
// wc_flags at IB_WC_GRH for RC and UC receives too (rxe_resp.c, Linux
// 6.1). rxed set it on UD and GSI only (the audit of UD against rxe
// 6.1, area a). Only UD places the GRH in the buffer: an RC SEND's
// byte_len and data do not include it.
func TestEveryReceiveCompletionCarriesTheGRHFlag(t *testing.T) {
	for _, typ := range []Type{RC, UC} {
		t.Run(typ.String(), func(t *testing.T) {
			l := newLink(t, typ, 7, 7)
			require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{l.b.sge(0, 64)}}))
			require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 2, SGL: []SGE{l.b.sge(64, 64)}}))
			l.post(SendWR{ID: 1, Opcode: WRSend, SGL: []SGE{l.a.sge(0, 8)}},
				SendWR{ID: 2, Opcode: WRRDMAWriteWithImm, Imm: 5, SGL: []SGE{l.a.sge(0, 8)},
					RemoteAddr: l.b.m.IOVA() + 512, RKey: l.b.m.RKey()})
			l.deliver(l.b, l.a, l.a.env.take()...)
			rwc := poll(t, l.b.rcq)
			require.Len(t, rwc, 2)
			require.Equal(t, WCRecv, rwc[0].Opcode)
			require.Equal(t, WCWithGRH, rwc[0].Flags)
			require.Equal(t, uint32(8), rwc[0].ByteLen, "no GRH in an RC/UC buffer")
			require.Equal(t, WCRecvRDMAWithImm, rwc[1].Opcode)
			require.Equal(t, WCWithGRH|WCWithImm, rwc[1].Flags)
		})
	}
}
