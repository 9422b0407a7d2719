package rdmacm_test

import (
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestSRQBitOfREQAndREP: a QP that receives through an SRQ sets the SRQ
// bit of its REQ (Dial) or REP (Accept), as the kernel's cma_connect_ib
// and cma_accept_ib do (req.srq / rep.srq = id_priv->srq, from
// rdma_create_qp); a QP with its own receive queue leaves it clear. Bug
// (found by the RPC adopter's test, a server on an SRQ): the bit was
// always clear, so our REQs and REPs differed from the kernel's for an
// SRQ QP and the peer's CM (its event's param.srq) was told wrong.
func TestSRQBitOfREQAndREP(t *testing.T) {
	net := transport.NewMemNetwork()
	taps := map[string]*madTap{}
	open := func(s string) *host {
		taps[s] = &madTap{}
		return openMemHost(t, net, s, taps[s])
	}
	srv, cli := open("10.59.0.1"), open("10.59.0.2")
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.59.0.1:7471"), nil)
	require.NoError(t, err)
	defer l.Close()
	srqQP := func(h *host) *ib.QP {
		srq, err := h.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 8, MaxSGE: 1})
		require.NoError(t, err)
		q, err := h.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: h.cq, RecvCQ: h.cq, SRQ: srq,
			Cap: ib.QPCap{MaxSendWR: 8, MaxSendSGE: 1}})
		require.NoError(t, err)
		return q
	}
	last := func(tap *madTap, match func(mad.Message) bool) mad.Message {
		ms := tap.messages()
		for i := len(ms) - 1; i >= 0; i-- {
			if match(ms[i]) {
				return ms[i]
			}
		}
		t.Fatal("no such message sent")
		return nil
	}
	isREQ := func(m mad.Message) bool { _, ok := m.(*mad.REQ); return ok }
	isREP := func(m mad.Message) bool { _, ok := m.(*mad.REP); return ok }
	for _, tc := range []struct {
		name     string
		srv, cli bool // which side's QP uses an SRQ
	}{{"neither", false, false}, {"server", true, false}, {"client", false, true}} {
		pick := func(h *host, srq bool) *ib.QP {
			if srq {
				return srqQP(h)
			}
			return h.qp(ib.RC)
		}
		accepted := make(chan error, 1)
		go func() {
			req, err := l.Accept(ctx)
			if err == nil {
				_, err = req.Accept(ctx, pick(srv, tc.srv), nil)
			}
			accepted <- err
		}()
		_, err := rdmacm.Dial(ctx, pick(cli, tc.cli), ap("10.59.0.1:7471"), nil)
		require.NoError(t, err, tc.name)
		require.NoError(t, <-accepted, tc.name)
		require.Equal(t, tc.cli, last(taps["10.59.0.2"], isREQ).(*mad.REQ).SRQ, "%s: the REQ's SRQ bit", tc.name)
		require.Equal(t, tc.srv, last(taps["10.59.0.1"], isREP).(*mad.REP).SRQ, "%s: the REP's SRQ bit", tc.name)
	}
}
