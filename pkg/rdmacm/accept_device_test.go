package rdmacm_test

import (
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestAcceptRefusesAQPOfAnotherDevice: a program with a device per
// address that accepts a request with a QP of the wrong device is told
// so, its QP untouched and the request still open, which a QP of the
// listener's device then accepts, and a SEND arrives. Bug (found by the
// RPC adopter's test): Accept took the QP, the REP named its number and
// the handshake succeeded, but the client's packets went to that number
// at the listener's GID, where no such QP lives, so every send failed
// (AcceptUD alike: the SIDR_REP named a QP the datagrams never reached).
// The kernel refuses it in rdma_create_qp (-EINVAL for a PD of another
// device than the cm_id's).
func TestAcceptRefusesAQPOfAnotherDevice(t *testing.T) {
	hs := memHosts(t, nil, "10.58.0.1", "10.58.0.2", "10.58.0.3")
	srv, cli, other := hs[0], hs[1], hs[2]
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.58.0.1:7471"), nil)
	require.NoError(t, err)
	defer l.Close()
	wrong, right := other.qp(ib.RC), srv.qp(ib.RC)
	require.NoError(t, ib.InitQP(right, ib.ConnectAttr{}))
	require.NoError(t, right.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{srv.sge(0, 64)}}))
	accepted := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			accepted <- err
			return
		}
		_, err = req.Accept(ctx, wrong, nil)
		if err == nil {
			accepted <- err
			return
		}
		if wrong.State() != ib.QPSReset {
			t.Errorf("the refused QP was moved to %v", wrong.State())
		}
		_, err = req.Accept(ctx, right, nil)
		accepted <- err
	}()
	q := cli.qp(ib.RC)
	_, err = rdmacm.Dial(ctx, q, ap("10.58.0.1:7471"), nil)
	require.NoError(t, err)
	require.NoError(t, <-accepted)
	copy(cli.buf, "to the right QP")
	require.NoError(t, q.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: []ib.SGE{cli.sge(0, 15)}}))
	require.Equal(t, ib.WCSuccess, cli.wc(ctx).Status)
	wc := srv.wc(ctx)
	require.Equal(t, ib.WCSuccess, wc.Status)
	require.Equal(t, "to the right QP", string(srv.buf[:wc.ByteLen]))

	// A UD request likewise.
	ul, err := rdmacm.Listen(srv.dev, ap("10.58.0.1:7472"), &rdmacm.ListenOptions{PortSpace: mad.PortSpaceUDP})
	require.NoError(t, err)
	defer ul.Close()
	uwrong, uright := other.qp(ib.UD), srv.qp(ib.UD)
	require.NoError(t, ib.ConnectQP(uright, ib.RemoteQP{}, ib.ConnectAttr{QKey: rdmacm.RDMAUDPQKey}))
	answered := make(chan error, 1)
	go func() {
		req, err := ul.Accept(ctx)
		if err != nil {
			answered <- err
			return
		}
		if err := req.AcceptUD(uwrong, rdmacm.RDMAUDPQKey, nil); err == nil {
			t.Errorf("AcceptUD took a QP of another device")
		}
		answered <- req.AcceptUD(uright, rdmacm.RDMAUDPQKey, nil)
	}()
	r, err := rdmacm.DialUD(ctx, cli.dev, ap("10.58.0.1:7472"), nil)
	require.NoError(t, err)
	require.NoError(t, <-answered)
	require.Equal(t, uright.Num(), r.QPN)
}
