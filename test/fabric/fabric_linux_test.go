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
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/internal/netns"
	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
)

const (
	hosts   = 8
	subnet  = "10.199.0." // a private test subnet that exists only inside the namespaces
	msgSize = 64 << 10
	// per host: hosts source slots, then a slot per writer and round (a
	// round never writes memory an earlier round's check read: the race
	// detector sees no order through the sockets), then multicast receives
	bufSize = (hosts+hosts*meshRounds)*msgSize + 1<<20
	// meshRounds of the all-to-all WRITE (each 8*7 WRITEs of 64 KiB)
	meshRounds = 10
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
	// faulty is the device's fault injector (fabric's fault), else nil
	faulty *transport.Faulty
}

// hostNet is one host's namespace and address on the bridge.
type hostNet struct {
	ns   *netns.NS
	addr netip.Addr
}

// network creates the bridge namespace and n host namespaces on it
// (10.199.0.1..n); everything is deleted when the test ends, whichever
// way it ends.
func network(t *testing.T, n int) []hostNet {
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
	var hs []hostNet
	for i := 1; i <= n; i++ {
		h := hostNet{ns: mk(fmt.Sprintf("rxfab-h%d", i)), addr: netip.MustParseAddr(fmt.Sprintf("%s%d", subnet, i))}
		v := fmt.Sprintf("v%d", i)
		require.NoError(t, br.IP("link", "add", v, "type", "veth", "peer", "name", "eth0", "netns", h.ns.Name))
		require.NoError(t, br.IP("link", "set", v, "master", "br0", "up"))
		require.NoError(t, h.ns.IP("addr", "add", h.addr.String()+"/24", "dev", "eth0"))
		require.NoError(t, h.ns.IP("link", "set", "eth0", "up"))
		require.NoError(t, h.ns.IP("route", "add", "224.0.0.0/4", "dev", "eth0"))
		hs = append(hs, h)
	}
	return hs
}

// fabric is network with one rxed device per host, opened in this
// process. fault, if not nil, gives host i (0-based) rxed's fault
// injection on its device (nil: none).
func fabric(t *testing.T, n int, fault func(i int) *transport.FaultConfig) []*host {
	t.Helper()
	var hs []*host
	for i, hn := range network(t, n) {
		h := &host{ns: hn.ns, addr: hn.addr}
		cfg := ib.Config{Addrs: []netip.Addr{h.addr}}
		if fault != nil {
			if cfg.Fault = fault(i); cfg.Fault != nil {
				cfg.Wrap = func(c transport.Conn) (transport.Conn, error) { h.faulty, _ = c.(*transport.Faulty); return c, nil }
			}
		}
		require.NoError(t, h.ns.Do(func() error {
			var err error
			h.dev, err = ib.OpenDevice(cfg)
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

// connect moves qa to RTS towards qb; timeout is the local ACK timeout
// exponent (4.096 us << timeout).
func connect(t *testing.T, a *host, qa *ib.QP, b *host, qb *ib.QP, timeout uint8) {
	require.NoError(t, ib.ConnectQP(qa, ib.RemoteQP{QPN: qb.Num(), PSN: 7, GID: b.addr, MTU: ib.MTU1024},
		ib.ConnectAttr{SGIDIndex: -1, PSN: 7, AccessFlags: ib.AccessRemoteWrite, Timeout: timeout,
			RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1, MaxRdAtomic: 1, MaxDestRdAtomic: 1}))
}

// cpuTime is the process's user+system CPU time so far (getrusage
// RUSAGE_SELF): all hosts run in this one process, so per-host CPU is
// only available as this total divided by the hosts.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// mesh connects a full mesh of RC QPs (a pair per unordered pair of
// hosts) and has every host WRITE 64 KiB of its own pattern into a slot of
// every other host's buffer, rounds times; every slot is checked byte for
// byte after each round. It logs the aggregate bandwidth and the CPU time
// per host, and returns the WRITE phase's wall time.
func mesh(t *testing.T, hs []*host, rounds int, label string, timeout uint8) time.Duration {
	type link struct {
		i, j   int
		qi, qj *ib.QP
	}
	var links []link
	for i := range hs {
		for j := i + 1; j < len(hs); j++ {
			qi, qj := hs[i].rcQP(t, hs[i].cq), hs[j].rcQP(t, hs[j].cq)
			connect(t, hs[i], qi, hs[j], qj, timeout)
			connect(t, hs[j], qj, hs[i], qi, timeout)
			links = append(links, link{i, j, qi, qj})
		}
	}
	n := len(hs)
	require.Len(t, links, n*(n-1)/2)
	pattern := func(round, from, to int) []byte {
		return bytes.Repeat([]byte{byte(from<<4 | to), byte(round)}, msgSize/2)
	}
	slot := func(r, from int) int { return (n + r*n + from) * msgSize } // where host `from` writes in a peer's buffer in round r
	write := func(r, from int, q *ib.QP, to int) {
		h, peer := hs[from], hs[to]
		wr := ib.SendWR{ID: uint64(to), Opcode: ib.WRRDMAWriteWithImm, Imm: uint32(from), Flags: ib.SendSignaled,
			SGL:        []ib.SGE{{Addr: h.mr.IOVA() + uint64(to*msgSize), Length: msgSize, LKey: h.mr.LKey()}},
			RemoteAddr: peer.mr.IOVA() + uint64(slot(r, from)), RKey: peer.mr.RKey()}
		require.NoError(t, q.PostSend(wr))
	}
	var elapsed time.Duration
	cpu0 := cpuTime(t)
	for r := range rounds {
		for i, h := range hs {
			for j := range hs {
				if i != j {
					copy(h.buf[j*msgSize:], pattern(r, i, j)) // the source of i's WRITE to j
				}
			}
		}
		for _, l := range links { // a receive for the peer's WRITE_WITH_IMM on each end
			require.NoError(t, l.qi.PostRecv(ib.RecvWR{ID: uint64(l.j)}))
			require.NoError(t, l.qj.PostRecv(ib.RecvWR{ID: uint64(l.i)}))
		}
		start := time.Now()
		for _, l := range links {
			write(r, l.i, l.qi, l.j)
			write(r, l.j, l.qj, l.i)
		}
		// Each host sees its n-1 WRITEs complete and the n-1 WRITEs into its buffer
		// arrive (their immediates name the writers). Reading the buffer after the
		// receive completions also orders the reads after the engine's writes for
		// the race detector, which sees no order through the sockets.
		for to, h := range hs {
			from := map[uint32]bool{}
			for range 2 * (n - 1) {
				wc := wait(t, h.cq)
				if wc.Opcode == ib.WCRecvRDMAWithImm {
					require.False(t, from[wc.Imm], "host %d: a second WRITE from host %d", to+1, wc.Imm+1)
					from[wc.Imm] = true
				}
			}
			require.Len(t, from, n-1, "host %d: WRITEs received", to+1)
		}
		elapsed += time.Since(start)
		for to, h := range hs {
			for from := range hs {
				if from != to {
					require.True(t, bytes.Equal(pattern(r, from, to), h.buf[slot(r, from):slot(r, from)+msgSize]),
						"round %d: host %d's slot for host %d", r, to+1, from+1)
				}
			}
		}
	}
	cpu := cpuTime(t) - cpu0
	total := float64(rounds*n*(n-1)*msgSize) / (1 << 20)
	t.Logf("%s: %d RC links, %d rounds of %d WRITEs of %d KiB checked, %.1f MiB in %v: %.0f MiB/s aggregate; "+
		"CPU %v in all (process user+sys, one process for all hosts), %v per host (%.0f%% of a core per host)",
		label, len(links), rounds, n*(n-1), msgSize>>10, total, elapsed.Round(time.Millisecond), total/elapsed.Seconds(),
		cpu.Round(time.Millisecond), (cpu / time.Duration(n)).Round(time.Millisecond),
		100*cpu.Seconds()/float64(n)/elapsed.Seconds())
	for _, l := range links { // the next mesh on these hosts gets fresh QPs
		require.NoError(t, l.qi.Destroy())
		require.NoError(t, l.qj.Destroy())
	}
	return elapsed
}

// Eight hosts in a full mesh of RC QPs: every host WRITEs 64 KiB of its
// own pattern into a slot of every other host's buffer, each checked
// byte for byte; then a UD multicast group across all eight, every
// member receiving every datagram (the sender's own host through the
// kernel's multicast loopback).
func TestEightHostFabric(t *testing.T) {
	hs := fabric(t, hosts, nil)
	// ACK timeout 0.27 s (exponent 16), as the lossy mesh: with the race
	// detector and other packages' tests on 2 cores, eight engines in one
	// process went without an ACK for 67 ms often enough to spend a QP's 7
	// retries (a CI run: RETRY_EXC_ERR; every host's counters showed 23-117
	// local ACK timeouts and thousands of duplicate requests, but not one
	// sequence NAK: nothing was lost, the timers were spurious; the same
	// under load at the session's first commit).
	mesh(t, hs, meshRounds, "mesh", 16)

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

// The same mesh with 2% loss on one link: host 2's device drops 2% of
// what it sends and of what it receives (rxed's fault injection,
// ib.Config.Fault: this kernel has no sch_netem for tc on the veth).
// Every WRITE still completes with its data intact (RC go-back-N, NAK
// sequence errors, retransmit timers), and the loss really happened.
func TestEightHostFabricLossyLink(t *testing.T) {
	const lossy = 1 // host 2
	hs := fabric(t, hosts, func(i int) *transport.FaultConfig {
		if i != lossy {
			return nil
		}
		return &transport.FaultConfig{Loss: 0.02, Seed: 16}
	})
	// ACK timeout 0.27 s (exponent 16) instead of 67 ms: under -race on 2 cores the 67 ms
	// timer fires spuriously often enough to use up the 7 retries (seen once:
	// RETRY_EXC_ERR); loss is recovered by NAK sequence errors first anyway
	mesh(t, hs, meshRounds, "mesh, 2% loss on host 2's link", 16)
	c := hs[lossy].dev.Counters()
	require.NotNil(t, hs[lossy].faulty)
	sent, rcvd := hs[lossy].faulty.FaultStats()
	lost := sent.Lost + rcvd.Lost
	var peerRetx uint64
	for i, h := range hs {
		if i != lossy {
			peerRetx += h.dev.Counters()["retransmit_timeouts"] + h.dev.Counters()["rcvd_seq_err"]
		}
	}
	t.Logf("host 2: the fault dropped %d of %d datagrams sent, %d of %d received; host 2 retransmit_timeouts %d, rcvd_seq_err %d, duplicate_request %d; "+
		"the other hosts' retransmit_timeouts+rcvd_seq_err %d",
		sent.Lost, sent.Seen, rcvd.Lost, rcvd.Seen, c["retransmit_timeouts"], c["rcvd_seq_err"], c["duplicate_request"], peerRetx)
	require.NotZero(t, lost, "the lossy link lost nothing")
	for i, h := range hs {
		for k, v := range h.dev.Counters() {
			if k == "retry_exceeded_err" || k == "send_err" {
				require.Zero(t, v, "host %d %s", i+1, k)
			}
		}
	}
}
