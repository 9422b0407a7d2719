package ib_test

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// sendWithID is injector.send for a packet whose sender's kernel put
// Identification id in its IPv4 header (rdma_rxe's __ip_select_ident),
// sent to dst: the ICRC covers the ID, so it is sealed over that header.
func (in *injector) sendWithID(t *testing.T, h wire.Headers, payload []byte, dst netip.Addr, id uint16) {
	t.Helper()
	fl := wire.Flow{Src: in.flow.Src, Dst: netip.AddrPortFrom(dst, transport.RoCEv2Port)}
	pkt := make([]byte, h.Len(len(payload)))
	n, err := h.Encode(pkt, payload)
	require.NoError(t, err)
	var hdrs [28]byte
	fl.PutHeaders(hdrs[:], n)
	wire.SetIPv4ID(hdrs[:20], id)
	binary.LittleEndian.PutUint32(pkt[n-4:], wire.ICRC(hdrs[:20], hdrs[20:], pkt[:n-4]))
	require.NoError(t, in.conn.Send([][]byte{pkt[:n]}, transport.Endpoint{Local: fl.Src, Remote: fl.Dst}))
}

// The GRH of a UD receive holds the IPv4 header the datagram came with,
// byte for byte as rdma_rxe writes it (rxe_resp.c execute): 20 zero
// bytes, then the header with the sender's Identification, which the
// engine solves from the ICRC, and its checksum. Unicast and multicast,
// the multicast copy crossing shards (four workers). rxed wrote
// Identification 0 (the audit of UD against rxe 6.1, area a); the
// identifications are those of shared/pcaps/rdmacm_udaddy.pcap frame 3
// and rdmacm_mckey.pcap frame 1.
func TestUDGRHCarriesTheSendersIPv4Identification(t *testing.T) {
	n := transport.NewMemNetwork()
	rd := openMcDev(t, n, "10.66.0.2", 4)
	qps := []*mcQP{rd.udQP(t, 0, mcQKey)}
	for i := 1; i < 4; i++ {
		qps = append(qps, rd.udQP(t, i*64*mcSlot, mcQKey))
	}
	for _, q := range qps {
		require.NoError(t, q.qp.AttachMcast(mcGroup, 0))
		q.postRecvs(t, 2)
	}
	in := newInjector(t, n, "10.66.0.9", "10.66.0.2")
	h := wire.Headers{Opcode: wire.UDSendOnlyImm, PKey: 0xFFFF, QKey: mcQKey, SrcQP: 0x2d, Imm: 0x2d}

	check := func(q *mcQP, dst netip.Addr, id uint16) {
		t.Helper()
		wc := q.wait(t)
		require.Equal(t, ib.WCSuccess, wc.Status)
		require.Equal(t, uint32(40+100), wc.ByteLen)
		o := q.off + int(wc.ID)*mcSlot
		grh := rd.buf[o : o+40]
		require.Equal(t, make([]byte, 20), grh[:20])
		want := make([]byte, 20)
		wire.Flow{Src: in.flow.Src, Dst: netip.AddrPortFrom(dst, transport.RoCEv2Port)}.PutIPHeader(want, 8+12+8+4+100+4)
		wire.SetIPv4ID(want, id)
		require.Equal(t, want, grh[20:], "QP %#x: the IPv4 header with ID %#x", q.qp.Num(), id)
		require.Zero(t, wire.IPv4Checksum(grh[20:]), "a valid header checksum")
	}
	h.DestQP = qps[0].qp.Num()
	in.sendWithID(t, h, make([]byte, 100), rd.addr, 0xd40f)
	check(qps[0], rd.addr, 0xd40f)
	h.DestQP = ib.McastQPN
	in.sendWithID(t, h, make([]byte, 100), mcGroup.Unmap(), 0x9387)
	for _, q := range qps {
		check(q, mcGroup.Unmap(), 0x9387)
	}
}
