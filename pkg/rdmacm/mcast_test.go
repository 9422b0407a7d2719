package rdmacm_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// mcDevice opens a device on n at addr (port 4791) with a UD QP in RESET.
func mcDevice(t *testing.T, n *transport.MemNetwork, addr string) (*ib.Device, *ib.QP, *ib.CQ, *ib.MR, []byte) {
	t.Helper()
	conn, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), transport.RoCEv2Port))
	require.NoError(t, err)
	dev, err := ib.OpenDevice(ib.Config{Conn: conn})
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	cq, err := dev.CreateCQ(64)
	require.NoError(t, err)
	buf := make([]byte, 8192)
	mr, err := pd.RegMR(buf, ib.AccessLocalWrite)
	require.NoError(t, err)
	qp, err := pd.CreateQP(ib.QPInitAttr{Type: ib.UD, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	return dev, qp, cq, mr, buf
}

// JoinMulticast as on RoCE: no MAD, the MGID ::ffff:239.1.1.1, Q_Key
// RDMA_UDP_QKEY, QPN 0xFFFFFF, hop limit 64; a QP in RESET comes out in
// RTS; two joined receivers get the sender's datagram addressed with the
// join's parameters; Leave detaches.
func TestJoinMulticastRoCE(t *testing.T) {
	n := transport.NewMemNetwork()
	sdev, sqp, scq, smr, _ := mcDevice(t, n, "10.70.0.1")
	group := netip.MustParseAddr("239.1.1.1")
	type rx struct {
		qp *ib.QP
		cq *ib.CQ
	}
	var rxs []rx
	for _, a := range []string{"10.70.0.2", "10.70.0.3"} {
		_, qp, cq, mr, _ := mcDevice(t, n, a)
		_, err := rdmacm.JoinMulticast(qp, group, &rdmacm.McastOptions{Local: netip.MustParseAddr(a)})
		require.NoError(t, err)
		require.Equal(t, ib.QPSRTS, qp.State())
		require.NoError(t, qp.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{{Addr: mr.IOVA(), Length: 4096, LKey: mr.LKey()}}}))
		rxs = append(rxs, rx{qp, cq})
	}
	m, err := rdmacm.JoinMulticast(sqp, group, nil)
	require.NoError(t, err)
	require.Equal(t, netip.MustParseAddr("::ffff:239.1.1.1"), m.MGID)
	require.Equal(t, uint32(0xFFFFFF), m.QPN)
	require.Equal(t, uint32(0x01234567), m.QKey)
	require.Equal(t, uint16(0), m.MLID)
	require.Equal(t, uint8(64), m.AV.HopLimit)
	require.Equal(t, m.MGID, m.AV.DGID)
	require.Zero(t, sdev.Counters()["sent_pkts"], "a RoCE join sends nothing (no SA MAD)")

	ah, err := sqp.PD().CreateAH(m.AV)
	require.NoError(t, err)
	wr := ib.SendWR{ID: 5, Opcode: ib.WRSendWithImm, Flags: ib.SendSignaled, Imm: sqp.Num(),
		SGL: []ib.SGE{{Addr: smr.IOVA(), Length: 100, LKey: smr.LKey()}}}
	ib.UDSend(&wr, ah, m.QPN, m.QKey)
	require.NoError(t, sqp.PostSend(wr))
	wait := func(cq *ib.CQ) ib.WC {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var wc [1]ib.WC
		_, err := cq.WaitPoll(ctx, wc[:])
		require.NoError(t, err)
		return wc[0]
	}
	require.Equal(t, ib.WCSuccess, wait(scq).Status)
	for _, r := range rxs {
		wc := wait(r.cq)
		require.Equal(t, ib.WCSuccess, wc.Status)
		require.Equal(t, uint32(140), wc.ByteLen)
		require.Equal(t, sqp.Num(), wc.Imm)
	}
	require.NoError(t, m.Leave())
	require.ErrorIs(t, m.Leave(), ib.ErrNotAttached)
	require.Empty(t, sdev.McastGroups())
}

// Bad input: a unicast group, another port space, a QP of another type
// or with another Q_Key, a local address the device does not have.
func TestJoinMulticastBadInput(t *testing.T) {
	n := transport.NewMemNetwork()
	dev, qp, cq, _, _ := mcDevice(t, n, "10.71.0.1")
	group := netip.MustParseAddr("239.1.1.1")
	_, err := rdmacm.JoinMulticast(qp, netip.MustParseAddr("10.71.0.9"), nil)
	require.ErrorIs(t, err, ib.ErrNotMcastGID)
	_, err = rdmacm.JoinMulticast(qp, group, &rdmacm.McastOptions{PortSpace: mad.PortSpaceIPoIB})
	require.ErrorIs(t, err, rdmacm.ErrMcastPortSpace)
	_, err = rdmacm.JoinMulticast(qp, group, &rdmacm.McastOptions{Local: netip.MustParseAddr("10.71.0.7")})
	require.ErrorContains(t, err, "no local address")
	_, err = rdmacm.JoinMulticast(qp, netip.MustParseAddr("ff0e::1"), nil)
	require.ErrorContains(t, err, "no local address", "IPv6 group on an IPv4-only device")

	pd := qp.PD()
	rc, err := pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	_, err = rdmacm.JoinMulticast(rc, group, nil)
	require.ErrorIs(t, err, ib.ErrMcastQPType)

	other, err := pd.CreateQP(ib.QPInitAttr{Type: ib.UD, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	require.NoError(t, ib.InitQP(other, ib.ConnectAttr{QKey: 0x1111}))
	_, err = rdmacm.JoinMulticast(other, group, nil)
	require.ErrorContains(t, err, "Q_Key 0x1111")
	require.ErrorIs(t, rdmacm.LeaveMulticast(qp, group), ib.ErrNotAttached)
	require.Empty(t, dev.McastGroups())
}
