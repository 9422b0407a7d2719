package rdmacm_test

import (
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestDialTOSIsThePathsTrafficClass: ConnParam.TOS (rdma_set_option's
// RDMA_OPTION_ID_TOS) is the REQ's primary path traffic class, as
// cma_resolve_iboe_route makes the ID's tos the route's traffic_class,
// and both QPs' AVs carry it (the passive side's from the REQ), so every
// packet of the connection leaves with it. Before: the REQ said 0 and
// rdmacm had no way to set it.
func TestDialTOSIsThePathsTrafficClass(t *testing.T) {
	net := transport.NewMemNetwork()
	tap := &madTap{}
	srv := openMemHost(t, net, "10.12.0.1", nil)
	cli := openMemHost(t, net, "10.12.0.2", tap)
	require.NoError(t, rdmacm.Enable(srv.dev, nil))
	require.NoError(t, rdmacm.Enable(cli.dev, nil))
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.12.0.1:7471"), nil)
	require.NoError(t, err)
	defer l.Close()
	served := serveOne(ctx, srv, l, nil)

	cq := cli.qp(ib.RC)
	_, err = rdmacm.Dial(ctx, cq, ap("10.12.0.1:7471"), &rdmacm.ConnParam{RetryCount: 7, RNRRetryCount: 7, TOS: 0x68})
	require.NoError(t, err)
	a := <-served
	require.NoError(t, a.err)

	var req *mad.REQ
	for _, m := range tap.messages() {
		if r, ok := m.(*mad.REQ); ok {
			req = r
		}
	}
	require.NotNil(t, req, "the client sent a REQ")
	require.Equal(t, uint8(0x68), req.Primary.TrafficClass, "REQ primary path traffic class")
	for name, q := range map[string]*ib.QP{"client": cq, "server": a.conn.QP()} {
		attr, _, err := q.Query()
		require.NoError(t, err)
		require.Equal(t, uint8(0x68), attr.AV.TrafficClass, "%s QP's AV", name)
		require.Equal(t, uint8(64), attr.AV.HopLimit, "%s QP's AV", name)
	}
}
