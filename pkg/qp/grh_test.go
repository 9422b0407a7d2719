package qp

import (
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// udaddyFrame3 is frame 3 of shared/pcaps/rdmacm_udaddy.pcap (rdma_rxe,
// Linux 6.1): 10.77.0.12:52239 -> 10.77.0.11:4791, a UD SEND_ONLY with
// immediate 0x2d from QP 0x2d to QP 0x2c, Q_Key 0x01234567, 100 zero
// bytes. ipv4 is its IPv4 header (Identification 0xd40f, DF, TTL 64,
// checksum 0x5191), udp its UDP payload (BTH to ICRC).
var udaddyFrame3 = struct{ ipv4, udp string }{
	ipv4: "4500009cd40f400040115191 0a4d000c 0a4d000b",
	udp: "6500ffff0000002c00000000 01234567 0000002d 0000002d" +
		strings.Repeat("00", 100) + "0fd87e97",
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	require.NoError(t, err)
	return b
}

// A UD receive's first 40 bytes are what rdma_rxe's execute writes: 20
// zero bytes and the packet's own IPv4 header, byte for byte, with the
// Identification the sender's kernel chose (the ICRC check solves it:
// RecvInfo.IPv4ID) and its header checksum. rxed wrote Identification 0
// and the checksum of that (the audit of UD against rxe 6.1, area a).
func TestUDGRHIsTheIPv4HeaderRxeWrites(t *testing.T) {
	f := udaddyFrame3
	ipv4, raw := unhex(t, f.ipv4), unhex(t, f.udp)
	l := newLink(t, UD, 0, 0)
	require.NoError(t, l.b.q.Modify(&Attr{State: RTS, QKey: 0x01234567}, AttrState|AttrQKey, l.now))
	l.b.buf[0] = 0xEE // the 20 bytes before the IPv4 header are zeroed
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{l.b.sge(0, 40+100)}}))
	var p wire.Packet
	require.NoError(t, p.Parse(raw))
	ri := RecvInfo{Src: netip.MustParseAddrPort("10.77.0.12:52239"), Dst: netip.MustParseAddrPort("10.77.0.11:4791"),
		IPv4ID: 0xd40f}
	require.Equal(t, DropNone, l.b.q.Check(&p, &ri, netip.Addr{}))
	l.b.q.Receive(l.b.env, &p, &ri, l.now)
	wc := poll(t, l.b.rcq)
	require.Len(t, wc, 1)
	require.Equal(t, WCSuccess, wc[0].Status)
	require.Equal(t, uint32(40+100), wc[0].ByteLen)
	require.Equal(t, uint32(0x2d), wc[0].SrcQP)
	require.Equal(t, uint32(0x2d), wc[0].Imm)
	require.Equal(t, WCWithGRH|WCWithImm, wc[0].Flags)
	require.Equal(t, make([]byte, 20), l.b.buf[:20])
	require.Equal(t, hex.EncodeToString(ipv4), hex.EncodeToString(l.b.buf[20:40]))
}

// Over IPv6 the GRH is the packet's IPv6 header, as rxe's execute copies
// ipv6_hdr(skb): the header of shared/pcaps/rc_pingpong_send_4096_ipv6.pcap
// frame 11 (fd77::12 -> fd77::11, traffic class and flow label 0, hop
// limit 64, payload length 1048), which a UD SEND of 1016 bytes matches
// byte for byte.
func TestUDGRHIsTheIPv6HeaderRxeWrites(t *testing.T) {
	ipv6 := unhex(t, "6000000004181140 fd770000000000000000000000000012 fd770000000000000000000000000011")
	l := connectLink(t, UD, 0, 0, newEnd(t, UD, 0x11, "fd77::12"), newEnd(t, UD, 0x12, "fd77::11"))
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{l.b.sge(0, 40+1016)}}))
	l.udSend(1, 1016)
	l.deliver(l.b, l.a, l.a.env.take()...)
	wc := poll(t, l.b.rcq)
	require.Len(t, wc, 1)
	require.Equal(t, uint32(40+1016), wc[0].ByteLen)
	require.Equal(t, hex.EncodeToString(ipv6), hex.EncodeToString(l.b.buf[:40]))
}
