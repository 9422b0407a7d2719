package ib_test

import (
	"strings"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// rcvd_pkts counts a multicast datagram once, however many attached QPs
// take it and even if none does, as rxe_rcv counts it before
// rxe_rcv_mcast_pkt fans it out. rxed counted it once per QP that took it
// (the audit of UD against rxe 6.1, area d).
func TestMcastDatagramCountsOnceInRcvdPkts(t *testing.T) {
	n := transport.NewMemNetwork()
	sd := openMcDev(t, n, "10.67.0.1", 1)
	sender := sd.udQP(t, 0, mcQKey)
	// Three members on a device of four workers, so on several shards:
	// their completions come after the fan-out, which counted.
	rd := openMcDev(t, n, "10.67.0.2", 4)
	var members []*mcQP
	for i := range 3 {
		m := rd.udQP(t, i*64*mcSlot, mcQKey)
		require.NoError(t, m.qp.AttachMcast(mcGroup, 0))
		m.postRecvs(t, 4)
		members = append(members, m)
	}
	before := rd.dev.Counters()["rcvd_pkts"]
	sender.send(t, mcGroup, ib.McastQPN, mcQKey, 1, 16)
	for _, m := range members {
		m.recvFrom(t, sender, 1, 16, mcGroup)
	}
	require.Equal(t, before+1, rd.dev.Counters()["rcvd_pkts"], "three QPs took it: counted once")

	// Two members that both refuse the datagram's Q_Key, on a device of
	// one worker: the marker is handled after the datagram.
	od := openMcDev(t, n, "10.67.0.3", 1)
	var odd []*mcQP
	for i := range 2 {
		m := od.udQP(t, i*64*mcSlot, 0x1111)
		require.NoError(t, m.qp.AttachMcast(mcGroup, 0))
		m.postRecvs(t, 4)
		odd = append(odd, m)
	}
	before = od.dev.Counters()["rcvd_pkts"]
	port0, err := od.dev.QueryPort(1)
	require.NoError(t, err)
	sender.send(t, mcGroup, ib.McastQPN, mcQKey, 2, 16)
	odd[0].marker(t, sender, 0x1111)
	for _, m := range odd {
		m.empty(t)
	}
	require.Equal(t, before+1+1, od.dev.Counters()["rcvd_pkts"], "the refused datagram once, the marker once")
	require.Equal(t, uint64(2), od.dev.Counters()["drop_qkey"], "each member refused it")
	// So does rxe: rxe_rcv counts rcvd_pkts before rxe_rcv_mcast_pkt, and
	// check_keys counts each refusing QP in the port's qkey_viol_cntr
	// (set_qkey_viol_cntr), which QueryPort reports from drop_qkey. The
	// datagram in rcvd_pkts and under the Q_Key violation is rxe's count,
	// not a double count (the lead's audit of multicast counters, item 3).
	port, err := od.dev.QueryPort(1)
	require.NoError(t, err)
	require.Equal(t, port0.QKeyViolCntr+2, port.QKeyViolCntr)
}

// An attached QP that refuses a multicast datagram for its state (a UD
// QP attached in INIT, before RTR) skips it without a drop: rxe's
// rxe_rcv_mcast_pkt runs check_type_state per QP and moves on, counting
// nothing, after rxe_rcv counted the datagram in rcvd_pkts. rxed counted
// it twice, in rcvd_pkts and under drop_state (the lead's audit of the
// multicast counters, item 3). Its members that take it still do, and a
// Q_Key refusal stays a drop (TestMcastDatagramCountsOnceInRcvdPkts).
func TestMcastDatagramSkippedForStateCountsNoDrop(t *testing.T) {
	n := transport.NewMemNetwork()
	sd := openMcDev(t, n, "10.68.0.1", 1)
	sender := sd.udQP(t, 0, mcQKey)
	rd := openMcDev(t, n, "10.68.0.2", 1) // one worker: the marker comes last
	m := rd.udQP(t, 0, mcQKey)
	require.NoError(t, m.qp.AttachMcast(mcGroup, 0))
	m.postRecvs(t, 4)
	cq, err := rd.dev.CreateCQ(4)
	require.NoError(t, err)
	idle, err := rd.pd.CreateQP(ib.QPInitAttr{Type: ib.UD, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	require.NoError(t, idle.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, QKey: mcQKey},
		ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrQKey))
	require.NoError(t, idle.AttachMcast(mcGroup, 0))

	before := rd.dev.Counters()
	sender.send(t, mcGroup, ib.McastQPN, mcQKey, 1, 16)
	m.recvFrom(t, sender, 1, 16, mcGroup)
	m.marker(t, sender, mcQKey)
	after := rd.dev.Counters()
	require.Equal(t, before["rcvd_pkts"]+2, after["rcvd_pkts"], "the datagram and the marker")
	for k, v := range after {
		if strings.HasPrefix(k, "drop_") {
			require.Equal(t, before[k], v, "%s: the QP in INIT skipped the datagram, no drop", k)
		}
	}
	require.Equal(t, before["mcast_skipped"]+1, after["mcast_skipped"])
	wcs := make([]ib.WC, 1)
	require.Zero(t, cq.Poll(wcs), "the QP in INIT took nothing")
}
