package rdmacm

import (
	"net/netip"
	"testing"

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
