package rdmacm_test

import (
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/stretchr/testify/require"
)

// TestPeerDeviceCloseEndsTheConnection: a server whose device closes
// (Linger 0) ends its connections as destroyed cm_ids do, with a DREQ
// each, so the client's Conn ends (Done, ErrDisconnected, its QP in ERR
// and its posted receives flushed) instead of finding out only when its
// next send runs out of retries.
func TestPeerDeviceCloseEndsTheConnection(t *testing.T) {
	hs := memHosts(t, nil, "10.55.0.1", "10.55.0.2")
	srv, cli := hs[0], hs[1]
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.55.0.1:7471"), nil)
	require.NoError(t, err)
	accepted := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err == nil {
			_, err = req.Accept(ctx, srv.qp(ib.RC), nil)
		}
		accepted <- err
	}()
	q := cli.qp(ib.RC)
	require.NoError(t, ib.InitQP(q, ib.ConnectAttr{}))
	require.NoError(t, q.PostRecv(ib.RecvWR{ID: 9, SGL: []ib.SGE{cli.sge(0, 64)}}))
	conn, err := rdmacm.Dial(ctx, q, ap("10.55.0.1:7471"), nil)
	require.NoError(t, err)
	require.NoError(t, <-accepted)

	require.NoError(t, srv.dev.Close())
	select {
	case <-conn.Done():
	case <-ctx.Done():
		t.Fatalf("the client's connection did not end after the server's device closed (counters %v)", rdmacm.Counters(cli.dev))
	}
	require.ErrorIs(t, conn.Err(), rdmacm.ErrDisconnected)
	require.Equal(t, ib.QPSErr, q.State())
	wc := cli.wc(ctx)
	require.Equal(t, uint64(9), wc.ID)
	require.Equal(t, ib.WCWRFlushErr, wc.Status)
}
