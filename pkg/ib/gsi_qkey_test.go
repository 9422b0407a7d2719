package ib_test

import (
	"context"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// QP1 accepts a Q_Key in Modify, as ib_modify_qp does for IB_QPT_GSI
// (qp_state_table requires IB_QP_QKEY at RESET->INIT; ib_mad sets
// IB_QP1_QKEY there), and checks and sends with the GSI Q_Key whatever
// was set, as rdma_rxe 6.1: check_keys takes `qpn == 1 ? GSI_QKEY :
// qp->attr.qkey` and init_req_packet sends GSI_QKEY from QP1. A datagram
// to QP1 carrying the Q_Key Modify named is a Q_Key violation (drop_qkey,
// qkey_viol_cntr); one carrying 0x80010000 is taken. Query reports
// 0x80010000, the Q_Key QP1 uses, where rxe reports the value set
// (docs/DESIGN.md). The lead's audit of QP1 against rxe 6.1 (item 2:
// "QP1 ignores a Q_Key set by Modify").
func TestGSIChecksTheGSIQKeyWhateverModifySet(t *testing.T) {
	net := transport.NewMemNetwork()
	dev := madDevice(t, net, "10.0.0.2", nil)
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	cq, err := dev.CreateCQ(16)
	require.NoError(t, err)
	gsi, err := pd.CreateQP(ib.QPInitAttr{Type: ib.GSI, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	const set = 0x1234
	require.NoError(t, gsi.Modify(&ib.QPAttr{State: ib.QPSInit, QKey: set}, ib.AttrState|ib.AttrPKeyIndex|ib.AttrQKey))
	require.NoError(t, gsi.Modify(&ib.QPAttr{State: ib.QPSRTR, QKey: set}, ib.AttrState|ib.AttrQKey))
	require.NoError(t, gsi.Modify(&ib.QPAttr{State: ib.QPSRTS, QKey: set}, ib.AttrState|ib.AttrSQPSN|ib.AttrQKey))
	a, _, err := gsi.Query()
	require.NoError(t, err)
	require.Equal(t, uint32(ib.GSIQKey), a.QKey)

	buf := make([]byte, 4096)
	mr, err := pd.RegMR(buf, ib.AccessLocalWrite)
	require.NoError(t, err)
	for i := range 2 {
		require.NoError(t, gsi.PostRecv(ib.RecvWR{ID: uint64(i), SGL: []ib.SGE{{Addr: mr.IOVA() + uint64(i)*2048, Length: 2048, LKey: mr.LKey()}}}))
	}
	port0, err := dev.QueryPort(1)
	require.NoError(t, err)
	drops0 := dev.Counters()["drop_qkey"]

	in := newInjector(t, net, "10.0.0.9", "10.0.0.2")
	withSet := gsiHeaders(1)
	withSet.QKey = set
	in.send(t, withSet, testMAD(1))
	in.send(t, gsiHeaders(2), testMAD(2)) // after: one worker handles them in order

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wcs := make([]ib.WC, 2)
	n, err := cq.WaitPoll(ctx, wcs)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, ib.WCSuccess, wcs[0].Status)
	require.Equal(t, uint64(0), wcs[0].ID, "the GSI Q_Key's datagram took the first receive")
	require.Equal(t, testMAD(2), buf[40:40+len(testMAD(2))], "behind the GRH")
	require.Equal(t, drops0+1, dev.Counters()["drop_qkey"], "the Q_Key Modify set is a violation")
	port, err := dev.QueryPort(1)
	require.NoError(t, err)
	require.Equal(t, port0.QKeyViolCntr+1, port.QKeyViolCntr)
}
