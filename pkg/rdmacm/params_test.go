package rdmacm

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestStartingPSNMeaning pins what a CM message's Starting PSN means, from
// the rping capture of two rdma_rxe kernels (rdmacm_rping_v4.pcap): the
// REQ said 0x4d3d35, the REP 0xbe3769, and the client's (REQ sender's)
// first SEND carried PSN 0xbe3769 while the server's first READ request
// carried 0x4d3d35. So a side sends from the Starting PSN in the peer's
// message and receives from the one in its own (Linux's ib_cm: rq_psn
// from our REQ/REP, sq_psn from the peer's). rxed had it the other way
// round, which interoperated only with itself (found by the rping
// interop cells: every RC connection NAKed its first packet).
func TestStartingPSNMeaning(t *testing.T) {
	net := transport.NewMemNetwork()
	c, err := net.Listen(netip.MustParseAddrPort("10.0.0.1:4791"))
	require.NoError(t, err)
	dev, err := ib.OpenDevice(ib.Config{Conn: c})
	require.NoError(t, err)
	defer dev.Close()
	const reqPSN, repPSN = 0x4d3d35, 0xbe3769
	local, peer := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")

	// The active side (the rping client) sent the REQ with reqPSN.
	act := activeSetup(dev, &ConnParam{}, local, peer, ib.MTU1024, reqPSN,
		&mad.REP{LocalQPN: 0x2a, StartingPSN: repPSN}, 19)
	require.Equal(t, uint32(repPSN), act.attr.PSN, "active sq_psn: the REP's Starting PSN")
	require.Equal(t, uint32(reqPSN), act.remote.PSN, "active rq_psn: its own REQ's")
	require.Equal(t, uint32(0x2a), act.remote.QPN)

	// The passive side (the rping server) answers with repPSN.
	pas := passiveSetup(dev, &ConnParam{}, local, peer,
		&mad.REQ{LocalQPN: 0x2b, StartingPSN: reqPSN, PathMTU: 3, Primary: mad.Path{LocalACKTimeout: 19}}, repPSN)
	require.Equal(t, uint32(reqPSN), pas.attr.PSN, "passive sq_psn: the REQ's Starting PSN")
	require.Equal(t, uint32(repPSN), pas.remote.PSN, "passive rq_psn: its own REP's")
	require.Equal(t, ib.MTU1024, pas.remote.MTU)
	require.Equal(t, uint8(19), pas.attr.Timeout)
}

// TestAcceptTakesTheREQsTrafficClassAndTheRoutesHopLimit: the passive
// side's QP takes the traffic class of the REQ's primary path
// (cm_format_paths_from_req copies it, ib_init_ah_attr_from_path puts it
// in the AV's GRH, and rxe sends it as every packet's IP TOS) but not its
// hop limit: cm_req_handler overwrites the path's with the hop limit of
// the AV it built to answer the REQ (work->path[0].hop_limit =
// grh->hop_limit; ib_init_ah_attr_from_wc takes it from the route to the
// peer, 64), so a REQ with hop limit 9 still gives an AV with 64. Here a
// REQ with hop limit 9 and traffic class 0x48. Bugs: passiveSetup took a
// constant traffic class (the rdma_cm TOS task), then for a while the
// REQ's hop limit (the listener-edges task; the kernel's line above says
// otherwise, as a helper reading cm.c found).
func TestAcceptTakesTheREQsTrafficClassAndTheRoutesHopLimit(t *testing.T) {
	net := transport.NewMemNetwork()
	srv := MemDevice(t, net, "10.12.8.1")
	cli := MemDevice(t, net, "10.12.8.2")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raddr := netip.MustParseAddrPort("10.12.8.1:7484")
	l, err := Listen(srv, raddr, nil)
	require.NoError(t, err)
	defer l.Close()

	local, hdr, err := activeEnd(cli, &ConnParam{}, raddr)
	require.NoError(t, err)
	a, err := acquire(cli)
	require.NoError(t, err)
	_, err = a.cm.Connect(cm.ConnectParams{
		Src: local, Dst: raddr.Addr(), ServiceID: serviceID(0, raddr.Port()),
		QPN: 0x123, StartingPSN: a.cm.NewPSN(), PathMTU: uint8(ib.MTU1024), RetryCount: 7, RNRRetryCount: 7,
		PacketLifeTime: packetLifeTime, HopLimit: 9, TrafficClass: 0x48, PrivateData: hdr.Append(nil),
		AutoRTU: true, // our "QP" only lends its number: nothing is sent to it
	}, func(cm.Event) {})
	require.NoError(t, err)

	req, err := l.Accept(ctx)
	require.NoError(t, err)
	pd, err := srv.AllocPD()
	require.NoError(t, err)
	scq, err := srv.CreateCQ(8)
	require.NoError(t, err)
	q, err := pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: scq, RecvCQ: scq,
		Cap: ib.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	_, err = req.Accept(ctx, q, nil)
	require.NoError(t, err)
	attr, _, err := q.Query()
	require.NoError(t, err)
	require.Equal(t, uint8(64), attr.AV.HopLimit, "the AV's hop limit is the route's, not the REQ's 9")
	require.Equal(t, uint8(0x48), attr.AV.TrafficClass, "the AV's traffic class is the REQ's")
}
