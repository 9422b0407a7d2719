package ib_test

import (
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// ibv_query_port reports the P_Key and Q_Key refusals in bad_pkey_cntr
// and qkey_viol_cntr, as rdma_rxe's check_keys counts them (a multicast
// datagram once per attached QP that refuses it), and the device
// advertises both counters (IBV_DEVICE_BAD_PKEY_CNTR,
// IBV_DEVICE_BAD_QKEY_CNTR). rxed advertised them and reported neither
// (the audit of UD against rxe 6.1, area b).
func TestQueryPortCountsKeyViolations(t *testing.T) {
	n := transport.NewMemNetwork()
	rd := openMcDev(t, n, "10.65.0.2", 1)
	sd := openMcDev(t, n, "10.65.0.1", 1)
	da := rd.dev.QueryDevice()
	require.NotZero(t, da.DeviceCapFlags&ib.DeviceBadPKeyCntr)
	require.NotZero(t, da.DeviceCapFlags&ib.DeviceBadQKeyCntr)
	sender := sd.udQP(t, 0, mcQKey)
	r1 := rd.udQP(t, 0, mcQKey)
	r2 := rd.udQP(t, 64*mcSlot, mcQKey)
	for _, q := range []*mcQP{r1, r2} {
		require.NoError(t, q.qp.AttachMcast(mcGroup, 0))
		q.postRecvs(t, 8)
	}
	pa, err := rd.dev.QueryPort(1)
	require.NoError(t, err)
	require.Zero(t, pa.BadPKeyCntr)
	require.Zero(t, pa.QKeyViolCntr)

	sender.send(t, rd.addr, r1.qp.Num(), 0x7777, 1, 16) // unicast, wrong Q_Key: 1
	sender.send(t, mcGroup, ib.McastQPN, 0x7777, 2, 16) // both members refuse: 2
	in := newInjector(t, n, "10.65.0.9", "10.65.0.2")   // a P_Key rxed never sends
	in.send(t, wire.Headers{Opcode: wire.UDSendOnly, PKey: 0x1234, DestQP: r1.qp.Num(), QKey: mcQKey, SrcQP: 9}, make([]byte, 8))
	r1.marker(t, sender, mcQKey) // one worker: everything before it was judged
	r1.empty(t)
	r2.empty(t)
	pa, err = rd.dev.QueryPort(1)
	require.NoError(t, err)
	require.Equal(t, uint32(3), pa.QKeyViolCntr)
	require.Equal(t, uint32(1), pa.BadPKeyCntr)
	c := rd.dev.Counters()
	require.Equal(t, uint64(pa.QKeyViolCntr), c["drop_qkey"])
	require.Equal(t, uint64(pa.BadPKeyCntr), c["drop_pkey"])
}
