package e2e

import (
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/roce"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// A multicast datagram for a group no QP of the device is attached to
// (the last one just detached: the interop cell rxed-to-2rxed+rxe saw its
// own looped-back datagrams arrive after the leave) is ignored under
// mcast_no_member, not counted as drop_qp, as rdma_rxe drops it silently;
// QP 0xFFFFFF at a unicast address stays a drop_qp.
func TestMcastWithoutMemberIsNotADrop(t *testing.T) {
	local := netip.MustParseAddrPort("10.20.0.1:4791")
	peer := netip.MustParseAddrPort("10.20.0.2:4791")
	group := netip.MustParseAddrPort("239.1.1.1:4791")
	conn := newInjectConn(local)
	e, err := roce.New(roce.Config{Conn: conn, Workers: 1})
	require.NoError(t, err)
	defer e.Close()
	packet := func(dst netip.AddrPort) []byte {
		h := wire.Headers{Opcode: wire.UDSendOnly, PKey: 0xffff, DestQP: roce.McastQPN, QKey: 0x01234567, SrcQP: 0x33}
		b := make([]byte, h.Len(8))
		_, err := h.Encode(b, []byte("datagram"))
		require.NoError(t, err)
		wire.Flow{Src: peer, Dst: dst}.Seal(b)
		return b
	}
	conn.in <- injected{data: packet(group), ep: transport.Endpoint{Local: group, Remote: peer}}
	require.Eventually(t, func() bool { return e.Counters()[roce.CounterMcastNoMember] == 1 }, 5*time.Second, time.Millisecond)
	require.Zero(t, e.Counters()["drop_qp"])
	conn.in <- injected{data: packet(local), ep: transport.Endpoint{Local: local, Remote: peer}}
	require.Eventually(t, func() bool { return e.Counters()["drop_qp"] == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, uint64(1), e.Counters()[roce.CounterMcastNoMember])
}
