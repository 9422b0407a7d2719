package e2e

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/stretchr/testify/require"
)

// TestUCSendWrite: UC carries SENDs and WRITEs (with immediate) without
// ACKs.
func TestUCSendWrite(t *testing.T) {
	na, a, nb, b := pair(t, qpOpts{typ: ib.UC, mtu: ib.MTU1024})
	fill(na.buf[:10000], 5)
	require.NoError(t, b.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{sge(nb, 0, 10000)}}))
	require.NoError(t, a.PostSend(ib.SendWR{ID: 10, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: []ib.SGE{sge(na, 0, 5000)}}))
	waitOK(t, na.scq, 10, ib.WCSend)
	rwc := waitOK(t, nb.rcq, 1, ib.WCRecv)
	require.Equal(t, uint32(5000), rwc.ByteLen)
	require.Equal(t, na.buf[:5000], nb.buf[:5000])

	require.NoError(t, b.PostRecv(ib.RecvWR{ID: 2}))
	require.NoError(t, a.PostSend(ib.SendWR{ID: 11, Opcode: ib.WRRDMAWriteWithImm, Flags: ib.SendSignaled, Imm: 77,
		SGL: []ib.SGE{sge(na, 0, 10000)}, RemoteAddr: nb.mr.IOVA() + 20000, RKey: nb.mr.RKey()}))
	waitOK(t, na.scq, 11, ib.WCRDMAWrite)
	rwc = waitOK(t, nb.rcq, 2, ib.WCRecvRDMAWithImm)
	require.Equal(t, uint32(77), rwc.Imm)
	require.Equal(t, uint32(10000), rwc.ByteLen)
	require.Equal(t, na.buf[:10000], nb.buf[20000:30000])
	c := nb.dev.Counters()
	require.Zero(t, na.dev.Counters()["rcvd_pkts"], "UC responder must not ACK")
	require.Equal(t, uint64(5+10), c["rcvd_pkts"])
}

// TestUDSendGRHAndQKey: UD messages carry the source QPN and a GRH with
// the IPv4 header in the completion; a wrong Q_Key is dropped and counted.
func TestUDSendGRHAndQKey(t *testing.T) {
	na, a, nb, b := pair(t, qpOpts{typ: ib.UD})
	ah, err := na.pd.CreateAH(ib.AHAttr{DGID: nb.addr, DestPort: nb.dev.UDPPort(), PortNum: 1})
	require.NoError(t, err)
	fill(na.buf[:1000], 6)
	require.NoError(t, b.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{sge(nb, 0, 40+1024)}}))
	wr := ib.SendWR{ID: 5, Opcode: ib.WRSendWithImm, Flags: ib.SendSignaled, Imm: 0x1234, SGL: []ib.SGE{sge(na, 0, 1000)}}
	ib.UDSend(&wr, ah, b.Num(), 0x11111111)
	require.NoError(t, a.PostSend(wr))
	waitOK(t, na.scq, 5, ib.WCSend)
	rwc := waitOK(t, nb.rcq, 1, ib.WCRecv)
	require.Equal(t, uint32(1040), rwc.ByteLen)
	require.Equal(t, a.Num(), rwc.SrcQP)
	require.Equal(t, uint32(0x1234), rwc.Imm)
	require.NotZero(t, rwc.Flags&ib.WCWithGRH)
	require.Equal(t, na.buf[:1000], nb.buf[40:1040])
	// GRH area: 20 zero bytes, then the IPv4 header from A to B.
	require.Equal(t, make([]byte, 20), nb.buf[:20])
	ip := nb.buf[20:40]
	require.Equal(t, byte(0x45), ip[0])
	require.Equal(t, byte(17), ip[9])
	require.Equal(t, na.addr.As4(), [4]byte(ip[12:16]))
	require.Equal(t, nb.addr.As4(), [4]byte(ip[16:20]))

	// Wrong Q_Key: dropped, counted, no completion.
	require.NoError(t, b.PostRecv(ib.RecvWR{ID: 2, SGL: []ib.SGE{sge(nb, 0, 2000)}}))
	ib.UDSend(&wr, ah, b.Num(), 0x22222222)
	wr.ID = 6
	require.NoError(t, a.PostSend(wr))
	waitOK(t, na.scq, 6, ib.WCSend)
	require.Eventually(t, func() bool { return nb.dev.Counters()["drop_qkey"] == 1 }, 5*time.Second, time.Millisecond)
	noCompletion(t, nb.rcq)
	// Q_Key with the high bit set means "use the QP's own Q_Key".
	ib.UDSend(&wr, ah, b.Num(), 0x80000000)
	wr.ID = 7
	require.NoError(t, a.PostSend(wr))
	waitOK(t, na.scq, 7, ib.WCSend)
	waitOK(t, nb.rcq, 2, ib.WCRecv)
	// Larger than the MTU: no packet and no error (IBA C10-93.1.1; rxe's
	// requester fakes a successful UD send), and the QP carries on.
	require.NoError(t, b.PostRecv(ib.RecvWR{ID: 3, SGL: []ib.SGE{sge(nb, 0, 8192)}}))
	big := ib.SendWR{ID: 8, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: []ib.SGE{sge(na, 0, 5000)}}
	ib.UDSend(&big, ah, b.Num(), 0x11111111)
	require.NoError(t, a.PostSend(big))
	waitOK(t, na.scq, 8, ib.WCSend)
	noCompletion(t, nb.rcq)
	wr.ID = 9
	ib.UDSend(&wr, ah, b.Num(), 0x11111111)
	require.NoError(t, a.PostSend(wr))
	waitOK(t, na.scq, 9, ib.WCSend)
	waitOK(t, nb.rcq, 3, ib.WCRecv)
}

// TestSRQSharedByQPs: two QPs on one node consume receives from one SRQ;
// the limit event fires when the queue runs low.
func TestSRQSharedByQPs(t *testing.T) {
	net := newMemNet()
	na := newMemNode(t, net, "10.1.0.1", nodeOpts{})
	nb := newMemNode(t, net, "10.1.0.2", nodeOpts{})
	srq, err := nb.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 64, MaxSGE: 2})
	require.NoError(t, err)
	for i := 0; i < 8; i++ {
		require.NoError(t, srq.PostRecv(ib.RecvWR{ID: uint64(100 + i), SGL: []ib.SGE{sge(nb, 4096*i, 4096)}}))
	}
	require.NoError(t, srq.ArmLimit(3))
	o := qpOpts{}
	a1, a2 := na.createQP(o), na.createQP(o)
	b1, b2 := nb.createQP(qpOpts{srq: srq}), nb.createQP(qpOpts{srq: srq})
	connectQPs(t, na, a1, nb, b1, o)
	connectQPs(t, na, a2, nb, b2, o)
	require.Error(t, b1.PostRecv(ib.RecvWR{ID: 1}), "a QP with an SRQ has no receive queue of its own")
	fill(na.buf[:4096], 8)
	seen := map[uint32]int{}
	for i := 0; i < 6; i++ {
		q := a1
		if i%2 == 1 {
			q = a2
		}
		require.NoError(t, q.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRSend, Flags: ib.SendSignaled,
			SGL: []ib.SGE{sge(na, 0, 100+i)}}))
		waitOK(t, na.scq, uint64(i), ib.WCSend)
		rwc := wait(t, nb.rcq, 5*time.Second)
		require.Equal(t, ib.WCSuccess.String(), rwc.Status.String())
		require.Equal(t, uint64(100+i), rwc.ID, "SRQ hands out receives in order")
		require.Equal(t, uint32(100+i), rwc.ByteLen)
		seen[rwc.QPNum]++
	}
	require.Equal(t, map[uint32]int{b1.Num(): 3, b2.Num(): 3}, seen)
	require.Equal(t, 2, srq.Len())
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-nb.dev.Events():
			if ev.Type != ib.EventSRQLimitReached {
				continue
			}
			require.Equal(t, srq, ev.SRQ)
			return
		case <-deadline:
			t.Fatal("no SRQ limit event")
		}
	}
}

// TestLoopbackUDPEngines runs RC traffic between three engines over real
// loopback UDP sockets on 127.0.0.x with ephemeral ports.
func TestLoopbackUDPEngines(t *testing.T) {
	var nodes []*node
	for _, a := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"} {
		addr := netip.MustParseAddr(a)
		nodes = append(nodes, newNode(t, ib.Config{Addrs: []netip.Addr{addr}, EphemeralPort: true, Workers: 2}, addr, nodeOpts{}))
	}
	o := qpOpts{mtu: ib.MTU4096}
	// A ring: 0 -> 1 -> 2 -> 0, each writes 200 KiB and fetch-adds.
	for i, n := range nodes {
		peer := nodes[(i+1)%len(nodes)]
		q, pq := n.createQP(o), peer.createQP(o)
		connectQPs(t, n, q, peer, pq, o)
		fill(n.buf[:200<<10], i)
		require.NoError(t, q.PostSend(
			ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, SGL: []ib.SGE{sge(n, 0, 200<<10)}, RemoteAddr: peer.mr.IOVA() + 300<<10, RKey: peer.mr.RKey()},
			ib.SendWR{ID: 2, Opcode: ib.WRAtomicFetchAndAdd, Flags: ib.SendSignaled, CompareAdd: uint64(i + 1),
				SGL: []ib.SGE{sge(n, 600<<10, 8)}, RemoteAddr: peer.mr.IOVA() + 700<<10, RKey: peer.mr.RKey()}))
		waitOK(t, n.scq, 2, ib.WCFetchAdd)
		// Over real sockets the race detector cannot see the ACK order the
		// protocol guarantees; a call into the responder QP's worker makes
		// its memory writes visible to this goroutine.
		_, _, err := pq.Query()
		require.NoError(t, err)
		require.Equal(t, n.buf[:200<<10], peer.buf[300<<10:500<<10])
		require.Equal(t, uint64(i+1), binary.NativeEndian.Uint64(peer.buf[700<<10:]))
	}
}

// TestDualStackDevice: one device with an IPv4 and an IPv6 address (GID
// indexes 0 and 1) runs an RC QP over each family at once.
func TestDualStackDevice(t *testing.T) {
	v4a, v6 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")
	v4b := netip.MustParseAddr("127.0.0.2")
	na := newNode(t, ib.Config{Addrs: []netip.Addr{v4a, v6}, EphemeralPort: true}, v4a, nodeOpts{})
	nb := newNode(t, ib.Config{Addrs: []netip.Addr{v4b, v6}, EphemeralPort: true}, v4b, nodeOpts{})
	require.Equal(t, 1, na.dev.GIDIndex(v6))
	o := qpOpts{mtu: ib.MTU1024}
	// IPv4 pair via GID 0.
	a4, b4 := na.createQP(o), nb.createQP(o)
	connectQPs(t, na, a4, nb, b4, o)
	// IPv6 pair via GID 1: move both to RTS by hand with SGIDIndex 1.
	a6, b6 := na.createQP(o), nb.createQP(o)
	for _, s := range []struct {
		n    *node
		q    *ib.QP
		peer *node
		pq   *ib.QP
	}{{na, a6, nb, b6}, {nb, b6, na, a6}} {
		require.NoError(t, s.q.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, AccessFlags: ib.AccessRemoteWrite | ib.AccessRemoteRead},
			ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags))
		require.NoError(t, s.q.Modify(&ib.QPAttr{State: ib.QPSRTR, PathMTU: ib.MTU1024, DestQPN: s.pq.Num(), RQPSN: 5, MaxDestRdAtomic: 4,
			MinRNRTimer: 1, AV: ib.AddrVector{DGID: v6, SGIDIndex: 1, DestPort: s.peer.dev.Engine().Port(v6), PortNum: 1}},
			ib.AttrState|ib.AttrAV|ib.AttrPathMTU|ib.AttrDestQPN|ib.AttrRQPSN|ib.AttrMaxDestRdAtomic|ib.AttrMinRNRTimer))
		require.NoError(t, s.q.Modify(&ib.QPAttr{State: ib.QPSRTS, SQPSN: 5, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4},
			ib.AttrState|ib.AttrSQPSN|ib.AttrTimeout|ib.AttrRetryCnt|ib.AttrRNRRetry|ib.AttrMaxQPRdAtomic))
	}
	fill(na.buf[:20000], 6)
	require.NoError(t, a4.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{sge(na, 0, 10000)}, RemoteAddr: nb.mr.IOVA(), RKey: nb.mr.RKey()}))
	require.NoError(t, a6.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{sge(na, 10000, 10000)}, RemoteAddr: nb.mr.IOVA() + 10000, RKey: nb.mr.RKey()}))
	seen := map[uint64]bool{}
	for len(seen) < 2 {
		wc := wait(t, na.scq, 10*time.Second)
		require.Equal(t, ib.WCSuccess.String(), wc.Status.String())
		seen[wc.ID] = true
	}
	_, _, err := b4.Query()
	require.NoError(t, err)
	_, _, err = b6.Query()
	require.NoError(t, err)
	require.Equal(t, na.buf[:20000], nb.buf[:20000])
}
