//go:build linux

package ib_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/netns"
	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// linkLocalPair opens two devices on the two ends of a veth pair, each
// end in a network namespace of its own, bound to the IPv6 link-local
// addresses fe80::a%va and fe80::b%vb (added without DAD, so they are
// usable at once), or, with wildB, b's device on a socket bound to ::
// whose GID table is fe80::b. A peer's addr is its GID: the address
// without a zone, as a GID carries none (rdma_rxe's GID index 0 is such
// an address).
func linkLocalPair(t *testing.T, wildB bool) (a, b *peer) {
	t.Helper()
	why := netns.Available()
	testenv.Need(t, why == "", "%s", why)
	var nss [2]*netns.NS
	for i, side := range []string{"a", "b"} {
		ns, err := netns.Create(fmt.Sprintf("rxed-ll%s%v-%d", side, wildB, os.Getpid()))
		require.NoError(t, err)
		t.Cleanup(func() { ns.Delete() })
		nss[i] = ns
	}
	require.NoError(t, nss[0].IP("link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", nss[1].Name))
	ends := []struct{ dev, addr string }{{"va", "fe80::a"}, {"vb", "fe80::b"}}
	for i, end := range ends {
		require.NoError(t, nss[i].IP("addr", "add", end.addr+"/64", "dev", end.dev, "nodad"))
		require.NoError(t, nss[i].IP("link", "set", end.dev, "up"))
	}
	// The carrier comes a moment after both ends are up; neighbour
	// discovery before it fails, and the first packets with it.
	for i, end := range ends {
		require.Eventually(t, func() bool {
			out, err := nss[i].Command(context.Background(), "cat", "/sys/class/net/"+end.dev+"/operstate").Output()
			return err == nil && strings.TrimSpace(string(out)) == "up"
		}, 10*time.Second, 10*time.Millisecond, "%s never came up", end.dev)
	}
	peers := [2]*peer{}
	for i, end := range ends {
		ns := nss[i]
		bind := netip.MustParseAddr(end.addr + "%" + end.dev)
		var dev *ib.Device
		require.NoError(t, ns.Do(func() error {
			if wildB && i == 1 {
				conn, err := transport.OpenUDP(transport.UDPConfig{Addrs: []netip.Addr{netip.IPv6Unspecified()}, Port: transport.RoCEv2Port})
				if err != nil {
					return err
				}
				dev, err = ib.OpenDevice(ib.Config{Conn: conn, Addrs: []netip.Addr{netip.MustParseAddr(end.addr)}, Workers: 1})
				return err
			}
			var err error
			dev, err = ib.OpenDevice(ib.Config{Addrs: []netip.Addr{bind}, Workers: 1})
			return err
		}))
		p := &peer{dev: dev, addr: netip.MustParseAddr(end.addr), buf: make([]byte, 64<<10)}
		var err error
		p.pd, err = dev.AllocPD()
		require.NoError(t, err)
		p.cq, err = dev.CreateCQ(64)
		require.NoError(t, err)
		p.mr, err = p.pd.RegMR(p.buf, ib.AccessLocalWrite|remoteAll)
		require.NoError(t, err)
		t.Cleanup(p.close)
		peers[i] = p
	}
	return peers[0], peers[1]
}

// RoCEv2 between IPv6 link-local addresses, as rdma_rxe's GID index 0
// (fe80::/64 from the MAC) carries it: an RC SEND, RDMA WRITE and READ,
// and a UD SEND each way between two devices on a veth pair. The GID
// table holds the addresses without their zone; the sockets send on the
// interface they are bound to.
func TestLinkLocalIPv6InNetns(t *testing.T) {
	a, b := linkLocalPair(t, false)
	testLinkLocal(t, a, b)
}

// The same with b's device on a socket bound to :: (its GID table
// fe80::b, given apart): a send from the wildcard socket to a link-local
// GID leaves on the interface that has the source GID, and what it
// receives names the sender's GID.
//
// Bug (link-local from a socket bound to ::, lead's task list): the
// socket's IPV6_PKTINFO named the link-local source without an
// interface, which the kernel refuses (EINVAL), and the engine sealed
// the ICRC for UDP source port 0, the GID having no socket of its own.
func TestLinkLocalIPv6WildcardInNetns(t *testing.T) {
	a, b := linkLocalPair(t, true)
	testLinkLocal(t, a, b)
}

func testLinkLocal(t *testing.T, a, b *peer) {
	for _, p := range []*peer{a, b} {
		gid, err := p.dev.QueryGID(1, 0)
		require.NoError(t, err)
		require.Equal(t, p.addr, gid, "GID 0 is the bound address without its zone")
		require.Equal(t, uint16(4791), p.dev.Engine().Port(p.addr))
	}

	t.Run("RC", func(t *testing.T) {
		qa, qb := a.createQP(ib.RC), b.createQP(ib.RC)
		connectRC(a, qa, b, qb)
		connectRC(b, qb, a, qa)

		require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 7, SGL: []ib.SGE{b.sge(0, 256)}}))
		copy(a.buf, "link-local send")
		require.NoError(t, qa.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: []ib.SGE{a.sge(0, 15)}}))
		swc := nextWC(t, a.cq)
		require.Equal(t, ib.WCSuccess, swc.Status, "SEND: %v", swc.Status)
		rwc := nextWC(t, b.cq)
		require.Equal(t, ib.WCSuccess, rwc.Status)
		require.Equal(t, "link-local send", string(b.buf[:rwc.ByteLen]))

		copy(a.buf[1024:], "link-local write")
		require.NoError(t, qa.PostSend(
			ib.SendWR{ID: 2, Opcode: ib.WRRDMAWrite, SGL: []ib.SGE{a.sge(1024, 16)}, RemoteAddr: b.mr.IOVA() + 4096, RKey: b.mr.RKey()},
			ib.SendWR{ID: 3, Opcode: ib.WRRDMARead, Flags: ib.SendSignaled, SGL: []ib.SGE{a.sge(8192, 16)},
				RemoteAddr: b.mr.IOVA() + 4096, RKey: b.mr.RKey()}))
		wc := nextWC(t, a.cq)
		require.Equal(t, ib.WCSuccess, wc.Status, "READ: %v", wc.Status)
		require.Equal(t, uint64(3), wc.ID)
		// The READ of the written bytes proves the WRITE landed; b's
		// memory is not read here directly: nothing orders b's engine
		// goroutine, which wrote it, before this one (the race detector
		// sees no happens-before through the sockets).
		require.Equal(t, "link-local write", string(a.buf[8192:8208]))
	})

	t.Run("UD", func(t *testing.T) {
		const qkey = 0x11111111
		qa, qb := a.createQP(ib.UD), b.createQP(ib.UD)
		for _, q := range []*ib.QP{qa, qb} {
			require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, QKey: qkey},
				ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrQKey))
			require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState))
			require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSRTS, SQPSN: 1}, ib.AttrState|ib.AttrSQPSN))
		}
		for _, dir := range []struct {
			from, to   *peer
			qfrom, qto *ib.QP
		}{{a, b, qa, qb}, {b, a, qb, qa}} {
			from, to := dir.from, dir.to
			ah, err := from.pd.CreateAH(ib.AHAttr{DGID: to.addr, DestPort: to.dev.UDPPort(), PortNum: 1})
			require.NoError(t, err)
			defer ah.Destroy()

			require.NoError(t, dir.qto.PostRecv(ib.RecvWR{ID: 9, SGL: []ib.SGE{to.sge(16384, 40+512)}}))
			copy(from.buf[2048:], "datagram")
			wr := ib.SendWR{ID: 1, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: []ib.SGE{from.sge(2048, 8)}}
			ib.UDSend(&wr, ah, dir.qto.Num(), qkey)
			require.NoError(t, dir.qfrom.PostSend(wr))
			require.Equal(t, ib.WCSuccess, nextWC(t, from.cq).Status, "%v to %v", from.addr, to.addr)
			rwc := nextWC(t, to.cq)
			require.Equal(t, ib.WCSuccess, rwc.Status, "%v to %v", from.addr, to.addr)
			require.Equal(t, dir.qfrom.Num(), rwc.SrcQP)
			require.Equal(t, "datagram", string(to.buf[16384+40:16384+rwc.ByteLen]))
			// The GRH's source GID is the sender's address, zone-free.
			var sgid [16]byte
			copy(sgid[:], to.buf[16384+8:16384+24])
			require.Equal(t, from.addr, netip.AddrFrom16(sgid), "%v to %v", from.addr, to.addr)
		}
	})
}

// nextWC waits up to 10 s for the next completion on cq.
func nextWC(t *testing.T, cq *ib.CQ) ib.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]ib.WC
	_, err := cq.WaitPoll(ctx, wc[:])
	require.NoError(t, err, "no completion")
	return wc[0]
}
