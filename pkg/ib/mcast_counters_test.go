package ib_test

import (
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
