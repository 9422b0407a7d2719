package rdmacm_test

import (
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestREJLocalCommIDAsTheKernel: a REQ rdma_cm refuses itself (no
// listener takes its address) is refused from REQ_RCVD, as the kernel
// refuses it when cma_ib_req_handler fails, so its REJ names local comm
// ID 0; a REQ the application rejects after Listener.Accept is refused
// from MRA_REQ_SENT, where librdmacm's rdma_reject finds it (rdma_cm has
// armed its delayed MRA once its handler returned), so the REJ names our
// comm ID (cm_format_rej). Both are reason 28 and reach the dialer.
//
// Bug (CM task, session AG): both carried our comm ID.
func TestREJLocalCommIDAsTheKernel(t *testing.T) {
	net := transport.NewMemNetwork()
	tap := &madTap{}
	srv, cli := openMemHost(t, net, "fd03::1", tap), openMemHost(t, net, "fd03::2", nil)
	ctx := testCtx(t)

	lastREJ := func() *mad.REJ {
		t.Helper()
		var rej *mad.REJ
		for _, m := range tap.messages() {
			if r, ok := m.(*mad.REJ); ok {
				rej = r
			}
		}
		require.NotNil(t, rej, "the server sent no REJ")
		return rej
	}

	t.Run("refused by rdma_cm: REQ_RCVD", func(t *testing.T) {
		// An IPv4 wildcard listener does not take an IPv6 request.
		l, err := rdmacm.Listen(srv.dev, ap("0.0.0.0:5100"), nil)
		require.NoError(t, err)
		defer l.Close()
		_, err = rdmacm.Dial(ctx, cli.qp(ib.RC), ap("[fd03::1]:5100"), nil)
		var re *rdmacm.RejectError
		require.ErrorAs(t, err, &re)
		require.Equal(t, mad.REJConsumerDefined, re.Reason)
		rej := lastREJ()
		require.Zero(t, rej.LocalCommID, "REJ from REQ_RCVD: local comm ID 0")
		require.NotZero(t, rej.RemoteCommID)
		require.Equal(t, uint8(mad.REJMsgREQ), rej.MessageRejected)
	})
	t.Run("rejected by the application: MRA_REQ_SENT", func(t *testing.T) {
		l, err := rdmacm.Listen(srv.dev, ap("[fd03::1]:5101"), nil)
		require.NoError(t, err)
		defer l.Close()
		go func() {
			if req, err := l.Accept(ctx); err == nil {
				_ = req.Reject(nil)
			}
		}()
		_, err = rdmacm.Dial(ctx, cli.qp(ib.RC), ap("[fd03::1]:5101"), nil)
		var re *rdmacm.RejectError
		require.ErrorAs(t, err, &re)
		require.Equal(t, mad.REJConsumerDefined, re.Reason)
		rej := lastREJ()
		require.NotZero(t, rej.LocalCommID, "REJ from MRA_REQ_SENT: our comm ID")
		require.Equal(t, uint8(mad.REJMsgREQ), rej.MessageRejected)
	})
}
