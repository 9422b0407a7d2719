package qp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A UD or UC receive WR whose SGL cannot take the message (an lkey that
// names no MR, here in the GRH's bytes and in the payload's) completes
// with LOC_QP_OP_ERR and the QP enters ERR, flushing the receives after
// it: rxe 6.1's copy_data fails, send_data_in makes it
// RESPST_ERR_MALFORMED_WQE, "All, Class A" (do_class_ac_error, then
// rxe_qp_error). rxed completed the WR and went on with the QP in RTS (a
// GRH it could not write even as LOC_LEN_ERR); the audit of UD against
// rxe 6.1, area a.
func TestMalformedReceiveWRMovesTheQPToErr(t *testing.T) {
	cases := []struct {
		name string
		typ  Type
		sgl  func(e *end) []SGE
	}{
		{"UD, the GRH's SGE", UD, func(e *end) []SGE {
			bad := e.sge(0, 40)
			bad.LKey ^= 0xFF00
			return []SGE{bad, e.sge(40, 256)}
		}},
		{"UD, the payload's SGE", UD, func(e *end) []SGE {
			bad := e.sge(40, 256)
			bad.LKey ^= 0xFF00
			return []SGE{e.sge(0, 40), bad}
		}},
		{"UC", UC, func(e *end) []SGE {
			bad := e.sge(0, 256)
			bad.LKey ^= 0xFF00
			return []SGE{bad}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := newLink(t, c.typ, 0, 0)
			require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 1, SGL: c.sgl(l.b)}))
			require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 2, SGL: []SGE{l.b.sge(512, 512)}}))
			wr := SendWR{ID: 1, Opcode: WRSend, SGL: []SGE{l.a.sge(0, 100)}}
			if c.typ == UD {
				wr.AV, wr.RemoteQPN, wr.RemoteQKey = AddrVector{DGID: l.b.addr.Addr()}, l.b.q.Num(), 0x1234
			}
			l.post(wr)
			l.deliver(l.b, l.a, l.a.env.take()...)
			wc := poll(t, l.b.rcq)
			require.Len(t, wc, 2)
			require.Equal(t, WC{ID: 1, Status: WCLocQPOpErr, QPNum: l.b.q.Num()}, wc[0])
			require.Equal(t, WCWRFlushErr, wc[1].Status)
			require.Equal(t, Err, l.b.q.State())
		})
	}
}
