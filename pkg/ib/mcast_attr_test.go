package ib_test

import (
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// QueryDevice reports rdma_rxe's multicast limits (rxe_param.h: RXE_MAX_MCAST_GRP,
// RXE_MAX_MCAST_QP_ATTACH, RXE_MAX_TOT_MCAST_QP_ATTACH), and the per-group limit it reports
// is the one AttachMcast enforces.
func TestQueryDeviceMcastLimits(t *testing.T) {
	n := transport.NewMemNetwork()
	d := openMcDev(t, n, "10.65.0.1", 1)
	a := d.dev.QueryDevice()
	require.Equal(t, 8192, a.MaxMcastGrp)
	require.Equal(t, 56, a.MaxMcastQPAttach)
	require.Equal(t, 0x70000, a.MaxTotalMcastQPAttach)

	for i := 0; i < a.MaxMcastQPAttach; i++ {
		require.NoError(t, d.udQP(t, 0, mcQKey).qp.AttachMcast(mcGroup, 0), "QP %d", i)
	}
	require.ErrorIs(t, d.udQP(t, 0, mcQKey).qp.AttachMcast(mcGroup, 0), ib.ErrMcastGroupFull)
}
