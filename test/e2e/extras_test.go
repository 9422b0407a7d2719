package e2e

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// TestPcapRecordsVerifiableICRCs records a device's traffic and checks
// every RoCE frame in the capture against the ICRC computed over the IP
// and UDP headers the kernel would send: what Seal wrote is what a Linux
// rdma_rxe peer verifies.
func TestPcapRecordsVerifiableICRCs(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		name := map[bool]string{false: "ipv4", true: "ipv6"}[v6]
		t.Run(name, func(t *testing.T) {
			net := transport.NewMemNetwork()
			aAddr, bAddr := "10.2.0.1", "10.2.0.2"
			if v6 {
				aAddr, bAddr = "fd02::1", "fd02::2"
			}
			var capture bytes.Buffer
			a := netip.MustParseAddr(aAddr)
			c, err := net.Listen(netip.AddrPortFrom(a, transport.RoCEv2Port))
			require.NoError(t, err)
			na := newNode(t, ib.Config{Conn: c, Pcap: &capture}, a, nodeOpts{})
			nb := newMemNode(t, net, bAddr, nodeOpts{})
			o := qpOpts{mtu: ib.MTU1024}
			qa, qb := na.createQP(o), nb.createQP(o)
			connectQPs(t, na, qa, nb, qb, o)
			fill(na.buf[:5000], 2)
			require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{sge(nb, 0, 8192)}}))
			require.NoError(t, qa.PostSend(
				ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, SGL: []ib.SGE{sge(na, 0, 5000)}, RemoteAddr: nb.mr.IOVA(), RKey: nb.mr.RKey()},
				ib.SendWR{ID: 2, Opcode: ib.WRRDMARead, SGL: []ib.SGE{sge(na, 8192, 3000)}, RemoteAddr: nb.mr.IOVA(), RKey: nb.mr.RKey()},
				ib.SendWR{ID: 3, Opcode: ib.WRSendWithImm, Flags: ib.SendSignaled, SGL: []ib.SGE{sge(na, 0, 2000)}}))
			waitOK(t, na.scq, 3, ib.WCSend)
			require.NoError(t, na.dev.Close())
			sent, rcvd := captureOpcodes(t, capture.Bytes(), a)
			seen := map[wire.Opcode]int{}
			for op, n := range sent {
				seen[op] += n
			}
			for op, n := range rcvd {
				seen[op] += n
			}
			// Both directions are in the capture.
			require.Equal(t, 5, seen[wire.RCWriteFirst]+seen[wire.RCWriteMiddle]+seen[wire.RCWriteLast])
			require.Equal(t, 1, seen[wire.RCReadRequest])
			require.Equal(t, 3, seen[wire.RCReadResponseFirst]+seen[wire.RCReadResponseMiddle]+seen[wire.RCReadResponseLast])
			require.NotZero(t, seen[wire.RCAck])
		})
	}
}

// TestMemoryWindowAndSendWithInvalidate binds a type 2 window with a
// BIND_MW work request, writes through it, invalidates it from the peer
// with SEND_WITH_INV, and checks that the window's rkey is then refused.
func TestMemoryWindowAndSendWithInvalidate(t *testing.T) {
	net := newMemNet()
	na := newMemNode(t, net, "10.3.0.1", nodeOpts{})
	nb := newMemNode(t, net, "10.3.0.2", nodeOpts{})
	o := qpOpts{}
	qa, qb := na.createQP(o), nb.createQP(o)
	connectQPs(t, na, qa, nb, qb, o)
	// B binds a window over 4 KiB of its buffer, with MW_BIND on the region.
	bindMR, err := nb.pd.RegMR(nb.buf[:64<<10], ib.AccessLocalWrite|ib.AccessRemoteWrite|ib.AccessMWBind)
	require.NoError(t, err)
	mw, err := nb.pd.AllocMW(ib.MWType2)
	require.NoError(t, err)
	newKey := mr.IncKey(mw.RKey())
	require.NoError(t, qb.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRBindMW, Flags: ib.SendSignaled,
		Bind: ib.MWBindInfo{MWRKey: mw.RKey(), NewRKey: newKey, MRLKey: bindMR.LKey(), Addr: bindMR.IOVA() + 4096,
			Length: 4096, Access: ib.AccessRemoteWrite}}))
	wc := waitOK(t, nb.scq, 1, ib.WCBindMW)
	_ = wc
	fill(na.buf[:100], 4)
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{sge(na, 0, 100)}, RemoteAddr: bindMR.IOVA() + 4096, RKey: newKey}))
	waitOK(t, na.scq, 2, ib.WCRDMAWrite)
	require.Equal(t, na.buf[:100], nb.buf[4096:4196])
	// A SEND_WITH_INV carrying the window's rkey invalidates it at B.
	require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 3, SGL: []ib.SGE{sge(nb, 100000, 64)}}))
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 4, Opcode: ib.WRSendWithInv, Flags: ib.SendSignaled,
		InvalidateRKey: newKey, SGL: []ib.SGE{sge(na, 0, 16)}}))
	waitOK(t, na.scq, 4, ib.WCSend)
	rwc := waitOK(t, nb.rcq, 3, ib.WCRecv)
	require.NotZero(t, rwc.Flags&ib.WCWithInv)
	require.Equal(t, newKey, rwc.InvalidatedRKey)
	// The invalidated rkey no longer works: REM_ACCESS_ERR, memory untouched.
	snapshot := append([]byte(nil), nb.buf[4096:8192]...)
	fill(na.buf[:100], 5)
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 5, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{sge(na, 0, 100)}, RemoteAddr: bindMR.IOVA() + 4096, RKey: newKey}))
	wc = wait(t, na.scq, 10*time.Second)
	require.Equal(t, ib.WCRemAccessErr.String(), wc.Status.String())
	require.Equal(t, snapshot, nb.buf[4096:8192])
}

// TestFlushAndAtomicWrite runs the IBA 1.5 memory placement operations
// rxe supports: ATOMIC_WRITE stores 8 bytes, FLUSH is acknowledged.
func TestFlushAndAtomicWrite(t *testing.T) {
	net := newMemNet()
	na := newMemNode(t, net, "10.4.0.1", nodeOpts{})
	nb := newMemNode(t, net, "10.4.0.2", nodeOpts{})
	m, err := nb.pd.RegMR(nb.buf[:4096], ib.AccessLocalWrite|ib.AccessRemoteWrite|ib.AccessFlushGlobal)
	require.NoError(t, err)
	o := qpOpts{}
	qa, qb := na.createQP(o), nb.createQP(o)
	connectQPs(t, na, qa, nb, qb, o)
	binary.NativeEndian.PutUint64(na.buf[:8], 0x1122334455667788)
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRAtomicWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{sge(na, 0, 8)}, RemoteAddr: m.IOVA() + 64, RKey: m.RKey()}))
	waitOK(t, na.scq, 1, ib.WCAtomicWrite)
	_, _, err = qb.Query()
	require.NoError(t, err)
	require.Equal(t, uint64(0x1122334455667788), binary.NativeEndian.Uint64(nb.buf[64:]))
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRFlush, Flags: ib.SendSignaled,
		RemoteAddr: m.IOVA(), RKey: m.RKey(), CompareAdd: 1 /* placement: global */, Swap: 0}))
	waitOK(t, na.scq, 2, ib.WCFlush)
}

// TestDeviceQueries covers the device, port and GID queries and misuse of
// the verbs API.
func TestDeviceQueries(t *testing.T) {
	net := newMemNet()
	n := newMemNode(t, net, "10.5.0.1", nodeOpts{})
	da := n.dev.QueryDevice()
	require.Equal(t, 1, da.PhysPortCnt)
	require.Equal(t, 128, da.MaxQPRdAtom)
	pa, err := n.dev.QueryPort(1)
	require.NoError(t, err)
	require.Equal(t, ib.PortActive, pa.State)
	require.Equal(t, ib.MTU4096, pa.MaxMTU)
	_, err = n.dev.QueryPort(2)
	require.Error(t, err)
	g, err := n.dev.QueryGID(1, 0)
	require.NoError(t, err)
	require.Equal(t, netip.MustParseAddr("::ffff:10.5.0.1"), g, "IPv4 GIDs are IPv4-mapped")
	_, err = n.dev.QueryGID(1, 1)
	require.Error(t, err)
	require.Equal(t, 0, n.dev.GIDIndex(netip.MustParseAddr("10.5.0.1")))
	_, err = n.pd.CreateAH(ib.AHAttr{DGID: netip.MustParseAddr("fd00::9")})
	require.Error(t, err, "IPv6 destination from an IPv4 GID")
	_, err = n.pd.CreateQP(ib.QPInitAttr{Type: ib.RC})
	require.Error(t, err, "CQs are required")
	_, err = n.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: n.scq, RecvCQ: n.rcq, Cap: ib.QPCap{MaxSendWR: 1 << 20}})
	require.Error(t, err, "queue larger than the device allows")
	q := n.createQP(qpOpts{})
	err = q.Modify(&ib.QPAttr{State: ib.QPSRTS}, ib.AttrState)
	require.Error(t, err, "RESET -> RTS is not a transition")
	require.Equal(t, ib.QPSReset, q.State())
	a, init, err := q.Query()
	require.NoError(t, err)
	require.Equal(t, ib.QPSReset, a.State)
	require.Equal(t, ib.RC, init.Type)
	require.NotZero(t, n.dev.Counters()["sent_pkts"]+1)
	ev := <-n.dev.Events()
	require.Equal(t, ib.EventPortActive, ev.Type)
}
