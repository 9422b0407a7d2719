//go:build linux

// Package fabric runs rxed across several hosts: network namespaces it
// creates itself, joined by veth pairs to a bridge in a namespace of its
// own, one rxed device per host (all in this process: each device opens
// its sockets on a thread that entered its host's namespace).
package fabric

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/internal/netns"
	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/ib"
)

const (
	hosts   = 8
	subnet  = "10.199.0." // a private test subnet that exists only inside the namespaces
	bufSize = 1 << 20
	msgSize = 64 << 10
)

// host is one namespace with its device.
type host struct {
	ns   *netns.NS
	addr netip.Addr
	dev  *ib.Device
	pd   *ib.PD
	cq   *ib.CQ
	buf  []byte
	mr   *ib.MR
}

// fabric creates the bridge namespace and the hosts; everything is
// deleted when the test ends, whichever way it ends.
func fabric(t *testing.T, n int) []*host {
	t.Helper()
	why := netns.Available()
	testenv.Need(t, why == "", "the eight-host fabric: %s", why)
	var made []*netns.NS
	t.Cleanup(func() {
		for _, ns := range made {
			ns.Delete()
		}
	})
	mk := func(name string) *netns.NS {
		ns, err := netns.Create(name)
		require.NoError(t, err)
		made = append(made, ns)
		return ns
	}
	br := mk("rxfab-br")
	require.NoError(t, br.IP("link", "add", "br0", "type", "bridge"))
	require.NoError(t, br.IP("link", "set", "br0", "type", "bridge", "mcast_snooping", "0"))
	require.NoError(t, br.IP("link", "set", "br0", "up"))
	var hs []*host
	for i := 1; i <= n; i++ {
		h := &host{ns: mk(fmt.Sprintf("rxfab-h%d", i)), addr: netip.MustParseAddr(fmt.Sprintf("%s%d", subnet, i))}
		v := fmt.Sprintf("v%d", i)
		require.NoError(t, br.IP("link", "add", v, "type", "veth", "peer", "name", "eth0", "netns", h.ns.Name))
		require.NoError(t, br.IP("link", "set", v, "master", "br0", "up"))
		require.NoError(t, h.ns.IP("addr", "add", h.addr.String()+"/24", "dev", "eth0"))
		require.NoError(t, h.ns.IP("link", "set", "eth0", "up"))
		require.NoError(t, h.ns.IP("route", "add", "224.0.0.0/4", "dev", "eth0"))
		require.NoError(t, h.ns.Do(func() error {
			var err error
			h.dev, err = ib.OpenDevice(ib.Config{Addrs: []netip.Addr{h.addr}})
			return err
		}))
		t.Cleanup(func() { h.dev.Close() })
		var err error
		h.pd, err = h.dev.AllocPD()
		require.NoError(t, err)
		h.cq, err = h.dev.CreateCQ(4096)
		require.NoError(t, err)
		h.buf = make([]byte, bufSize)
		h.mr, err = h.pd.RegMR(h.buf, ib.AccessLocalWrite|ib.AccessRemoteWrite)
		require.NoError(t, err)
		hs = append(hs, h)
	}
	return hs
}

func wait(t *testing.T, cq *ib.CQ) ib.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wc [1]ib.WC
	_, err := cq.WaitPoll(ctx, wc[:])
	require.NoError(t, err)
	require.Equal(t, ib.WCSuccess, wc[0].Status, "%v", wc[0].String())
	return wc[0]
}

func (h *host) rcQP(t *testing.T, cq *ib.CQ) *ib.QP {
	q, err := h.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	return q
}

func connect(t *testing.T, a *host, qa *ib.QP, b *host, qb *ib.QP) {
	require.NoError(t, ib.ConnectQP(qa, ib.RemoteQP{QPN: qb.Num(), PSN: 7, GID: b.addr, MTU: ib.MTU1024},
		ib.ConnectAttr{SGIDIndex: -1, PSN: 7, AccessFlags: ib.QPAccessRemoteWrite, Timeout: 14,
			RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1, MaxRdAtomic: 1, MaxDestRdAtomic: 1}))
}

// Eight hosts in a full mesh of RC QPs: every host WRITEs 64 KiB of its
// own pattern into a slot of every other host's buffer, each checked
// byte for byte; then a UD multicast group across all eight, every
// member receiving every datagram (the sender's own host through the
// kernel's multicast loopback).
func TestEightHostFabric(t *testing.T) {
	hs := fabric(t, hosts)
	// The mesh: a QP pair per unordered pair of hosts.
	type link struct {
		i, j   int
		qi, qj *ib.QP
	}
	var links []link
	for i := range hs {
		for j := i + 1; j < len(hs); j++ {
			qi, qj := hs[i].rcQP(t, hs[i].cq), hs[j].rcQP(t, hs[j].cq)
			connect(t, hs[i], qi, hs[j], qj)
			connect(t, hs[j], qj, hs[i], qi)
			links = append(links, link{i, j, qi, qj})
		}
	}
	require.Len(t, links, hosts*(hosts-1)/2)
	pattern := func(from, to int) []byte {
		return bytes.Repeat([]byte{byte(from<<4 | to)}, msgSize)
	}
	slot := func(from int) int { return from * msgSize } // where host `from` writes in a peer's buffer
	for i, h := range hs {
		for j := range hs {
			if i != j {
				copy(h.buf[(hosts+j)*msgSize:], pattern(i, j)) // the source of i's WRITE to j
			}
		}
	}
	start := time.Now()
	write := func(from int, q *ib.QP, to int) {
		h, peer := hs[from], hs[to]
		wr := ib.SendWR{ID: uint64(to), Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
			SGL:        []ib.SGE{{Addr: h.mr.IOVA() + uint64((hosts+to)*msgSize), Length: msgSize, LKey: h.mr.LKey()}},
			RemoteAddr: peer.mr.IOVA() + uint64(slot(from)), RKey: peer.mr.RKey()}
		require.NoError(t, q.PostSend(wr))
	}
	for _, l := range links {
		write(l.i, l.qi, l.j)
		write(l.j, l.qj, l.i)
	}
	for _, h := range hs {
		for range hosts - 1 {
			wait(t, h.cq)
		}
	}
	elapsed := time.Since(start)
	for to, h := range hs {
		for from := range hs {
			if from != to {
				require.True(t, bytes.Equal(pattern(from, to), h.buf[slot(from):slot(from)+msgSize]),
					"host %d's slot for host %d", to+1, from+1)
			}
		}
	}
	total := float64(hosts*(hosts-1)*msgSize) / (1 << 20)
	t.Logf("mesh: %d RC links, %d WRITEs of %d KiB checked, %.1f MiB in %v (%.0f MiB/s aggregate)",
		len(links), hosts*(hosts-1), msgSize>>10, total, elapsed.Round(time.Millisecond), total/elapsed.Seconds())

	// The multicast group: a UD QP per host, attached (its device joins
	// the group from inside the host's namespace).
	group := netip.MustParseAddr("::ffff:239.1.1.1")
	const qkey, count, size = 0x01234567, 5, 256
	uds := make([]*ib.QP, len(hs))
	ucqs := make([]*ib.CQ, len(hs))
	for i, h := range hs {
		cq, err := h.dev.CreateCQ(64)
		require.NoError(t, err)
		q, err := h.pd.CreateQP(ib.QPInitAttr{Type: ib.UD, SendCQ: cq, RecvCQ: cq,
			Cap: ib.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
		require.NoError(t, err)
		require.NoError(t, ib.InitQP(q, ib.ConnectAttr{QKey: qkey}))
		require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState))
		require.NoError(t, q.Modify(&ib.QPAttr{State: ib.QPSRTS}, ib.AttrState|ib.AttrSQPSN))
		require.NoError(t, h.ns.Do(func() error { return q.AttachMcast(group, 0) }))
		for k := range count {
			off := uint64(bufSize - (k+1)*(40+size))
			require.NoError(t, q.PostRecv(ib.RecvWR{ID: uint64(k),
				SGL: []ib.SGE{{Addr: h.mr.IOVA() + off, Length: 40 + size, LKey: h.mr.LKey()}}}))
		}
		uds[i], ucqs[i] = q, cq
	}
	sender := uds[0]
	for k := range count {
		wr := ib.SendWR{ID: uint64(100 + k), Opcode: ib.WRSendWithImm, Imm: uint32(k), Flags: ib.SendSignaled,
			SGL: []ib.SGE{{Addr: hs[0].mr.IOVA(), Length: size, LKey: hs[0].mr.LKey()}},
			AV:  ib.AddrVector{DGID: group, PortNum: 1}, RemoteQPN: ib.McastQPN, RemoteQKey: qkey}
		require.NoError(t, sender.PostSend(wr))
	}
	for i := range hs {
		got := map[uint32]bool{}
		for len(got) < count {
			wc := wait(t, ucqs[i])
			if wc.Opcode == ib.WCSend {
				require.Zero(t, i, "only host 1 sends")
				continue
			}
			require.Equal(t, uint32(40+size), wc.ByteLen, "host %d", i+1)
			require.Equal(t, sender.Num(), wc.SrcQP)
			got[wc.Imm] = true
		}
	}
	t.Logf("multicast: %d datagrams to %v reached all %d hosts", count, group, hosts)
}
