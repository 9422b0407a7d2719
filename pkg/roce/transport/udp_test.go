package transport

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	lo1 = netip.MustParseAddr("127.0.0.1")
	lo2 = netip.MustParseAddr("127.0.0.2")
	lo6 = netip.MustParseAddr("::1")
)

// hasIPv6Loopback reports whether ::1 can be bound (containers without IPv6).
func hasIPv6Loopback() bool {
	c, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func openTestUDP(t testing.TB, cfg UDPConfig) Conn {
	t.Helper()
	c, err := OpenUDP(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func addrOf(c Conn, a netip.Addr) netip.AddrPort {
	for _, l := range c.LocalAddrs() {
		if l.Addr() == a {
			return l
		}
	}
	panic(fmt.Sprintf("no %v in %v", a, c.LocalAddrs()))
}

type offloadMode struct {
	name  string
	noGSO bool
	noGRO bool
}

var offloadModes = []offloadMode{
	{name: "gso+gro"},
	{name: "gso-only", noGRO: true},
	{name: "gro-only", noGSO: true},
	{name: "plain", noGSO: true, noGRO: true},
}

func TestUDPLoopbackBatches(t *testing.T) {
	sizes := map[string][]int{
		"equal64":    repeat(64, 200),
		"equal4k":    repeat(4096, 100),
		"mixed":      {1, 100, 100, 100, 7, 4096, 4096, 4000, 0, 12, 9216, 9216, 1500, 1500, 1500, 1499, 1500},
		"shortlast":  append(repeat(1024, 63), 17),
		"single":     {333},
		"gsoOverrun": repeat(1200, 130), // more than one GSO message's worth of segments
	}
	for _, m := range offloadModes {
		for name, sz := range sizes {
			t.Run(m.name+"/"+name, func(t *testing.T) {
				a := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo1}, DisableGSO: m.noGSO, DisableGRO: m.noGRO})
				b := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo2}, DisableGSO: m.noGSO, DisableGRO: m.noGRO})
				var bufs [][]byte
				for i, s := range sz {
					bufs = append(bufs, payload(i, s))
				}
				to := b.LocalAddrs()[0]
				require.NoError(t, a.Send(bufs, Endpoint{Local: a.LocalAddrs()[0], Remote: to}))
				got := receiveN(t, b, len(bufs), MaxDatagramSize)
				for i := range bufs {
					require.Equal(t, len(bufs[i]), len(got[i].data), "datagram %d size", i)
					require.Equal(t, bufs[i], got[i].data, "datagram %d", i)
					require.Equal(t, Endpoint{Local: to, Remote: a.LocalAddrs()[0]}, got[i].ep)
				}
				sa, sb := a.(StatsReporter).Stats(), b.(StatsReporter).Stats()
				require.Equal(t, uint64(len(bufs)), sa.SentPackets)
				require.Equal(t, uint64(len(bufs)), sb.ReceivedPackets)
				if m.noGSO {
					require.Zero(t, sa.GSOSends)
				} else if runtime.GOOS == "linux" && hasRun(sz) {
					gso, _ := probeOffloadsForTest()
					if gso {
						require.Positive(t, sa.GSOSends, "GSO available but unused")
					}
				}
				if m.noGRO {
					require.Zero(t, sb.GROReceives)
				}
			})
		}
	}
}

// TestUDPGROCoalesces checks that with GSO on the sender and GRO on the
// receiver, loopback hands over coalesced messages and Receive splits them
// back into the original datagrams.
func TestUDPGROCoalesces(t *testing.T) {
	gso, gro := probeOffloadsForTest()
	if !gso || !gro {
		t.Skip("kernel without UDP GSO/GRO")
	}
	a := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo1}})
	b := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo1}})
	bufs := make([][]byte, 40)
	for i := range bufs {
		bufs[i] = payload(i, 1000)
	}
	bufs[39] = payload(39, 10)
	require.NoError(t, a.Send(bufs, Endpoint{Remote: b.LocalAddrs()[0]}))
	// A small caller batch also exercises resuming inside a coalesced message.
	var got [][]byte
	for _, p := range receiveNBatch(t, b, len(bufs), 1000, 3) {
		got = append(got, p.data)
	}
	require.Equal(t, bufs, got)
	require.Positive(t, b.(StatsReporter).Stats().GROReceives)
	require.Equal(t, uint64(1), a.(StatsReporter).Stats().GSOSends)
}

func repeat(size, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = size
	}
	return s
}

// hasRun reports whether sizes has two consecutive equal non-zero sizes, so
// that GSO applies.
func hasRun(sizes []int) bool {
	for i := 1; i < len(sizes); i++ {
		if sizes[i] == sizes[i-1] && sizes[i] > 0 {
			return true
		}
	}
	return false
}

func TestUDPMultipleAddresses(t *testing.T) {
	addrs := []netip.Addr{lo1, lo2}
	v6 := hasIPv6Loopback()
	if v6 {
		addrs = append(addrs, lo6)
	} else {
		t.Log("no IPv6 loopback: testing IPv4 only")
	}
	srv := openTestUDP(t, UDPConfig{Addrs: addrs})
	require.Len(t, srv.LocalAddrs(), len(addrs))
	port := srv.LocalAddrs()[0].Port()
	require.NotZero(t, port)
	for i, l := range srv.LocalAddrs() {
		require.Equal(t, addrs[i], l.Addr())
		require.Equal(t, port, l.Port(), "ephemeral port reused across addresses")
	}
	cliAddrs := []netip.Addr{lo1}
	if v6 {
		cliAddrs = append(cliAddrs, lo6)
	}
	cli := openTestUDP(t, UDPConfig{Addrs: cliAddrs})

	// Send to each server address in turn; Endpoint.Local on receive must
	// name the address the packet was sent to.
	for round := range 3 {
		for i, dst := range srv.LocalAddrs() {
			id := round*10 + i
			require.NoError(t, cli.Send([][]byte{payload(id, 64), payload(id+100, 64)}, Endpoint{Remote: dst}))
			got := receiveN(t, srv, 2, 2048)
			require.Equal(t, payload(id, 64), got[0].data)
			require.Equal(t, payload(id+100, 64), got[1].data)
			for _, g := range got {
				require.Equal(t, dst, g.ep.Local)
				want := addrOf(cli, lo1)
				if dst.Addr().Is6() {
					want = addrOf(cli, lo6)
				}
				require.Equal(t, want, g.ep.Remote)
			}
			// Reply from the exact address the request arrived on.
			require.NoError(t, srv.Send([][]byte{payload(id, 8)}, Endpoint{Local: got[0].ep.Local, Remote: got[0].ep.Remote}))
			back := receiveN(t, cli, 1, 2048)
			require.Equal(t, dst, back[0].ep.Remote)
		}
	}
	// IPv4-mapped IPv6 forms (RoCE GIDs) select the IPv4 socket.
	mapped := netip.AddrPortFrom(netip.AddrFrom16(addrOf(srv, lo2).Addr().As16()), port)
	require.NoError(t, cli.Send([][]byte{{42}}, Endpoint{Local: netip.AddrPortFrom(netip.AddrFrom16(lo1.As16()), 0), Remote: mapped}))
	got := receiveN(t, srv, 1, 16)
	require.Equal(t, addrOf(srv, lo2), got[0].ep.Local)
}

func TestUDPSendErrors(t *testing.T) {
	c := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo1}})
	to := c.LocalAddrs()[0]
	require.ErrorIs(t, c.Send([][]byte{{1}}, Endpoint{Local: ap("127.0.0.9:0"), Remote: to}), ErrNoLocalAddr)
	require.ErrorIs(t, c.Send([][]byte{{1}}, Endpoint{Local: netip.AddrPortFrom(lo1, to.Port()+1), Remote: to}), ErrNoLocalAddr)
	require.ErrorIs(t, c.Send([][]byte{{1}}, Endpoint{Remote: ap("[::1]:5")}), ErrNoLocalAddr)
	require.ErrorIs(t, c.Send([][]byte{make([]byte, MaxDatagramSize+1)}, Endpoint{Remote: to}), ErrTooLarge)
	require.NoError(t, c.Send(nil, Endpoint{Remote: to}))

	_, err := OpenUDP(UDPConfig{})
	require.Error(t, err)
	_, err = OpenUDP(UDPConfig{Addrs: []netip.Addr{lo1}, Port: 70000})
	require.Error(t, err)
	_, err = OpenUDP(UDPConfig{Addrs: []netip.Addr{{}}})
	require.Error(t, err)
	// The port is taken.
	_, err = OpenUDP(UDPConfig{Addrs: []netip.Addr{lo1}, Port: int(to.Port())})
	require.Error(t, err)
	// A partially opened Conn releases what it opened: the first address
	// binds, the second is the busy one, and afterwards the first is free.
	probe := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo2}})
	busy := int(probe.LocalAddrs()[0].Port())
	_, err = OpenUDP(UDPConfig{Addrs: []netip.Addr{lo1, lo2}, Port: busy})
	require.Error(t, err)
	again, err := OpenUDP(UDPConfig{Addrs: []netip.Addr{lo1}, Port: busy})
	require.NoError(t, err)
	again.Close()
}

func TestUDPOversizeDropped(t *testing.T) {
	a := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo1}})
	b := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo1}, DisableGRO: true})
	// A datagram larger than our receive slots (MSG_TRUNC), sent by a plain socket.
	raw, err := net.ListenUDP("udp4", &net.UDPAddr{IP: lo1.AsSlice()})
	require.NoError(t, err)
	defer raw.Close()
	_, err = raw.WriteToUDPAddrPort(make([]byte, MaxDatagramSize+100), b.LocalAddrs()[0])
	require.NoError(t, err)
	// Then one larger than the caller's buffer, then a good one.
	require.NoError(t, a.Send([][]byte{make([]byte, 600), payload(1, 100)}, Endpoint{Remote: b.LocalAddrs()[0]}))
	got := receiveN(t, b, 1, 500)
	require.Equal(t, payload(1, 100), got[0].data)
	require.Equal(t, uint64(2), b.(StatsReporter).Stats().DropOversize)
}

func TestUDPCloseUnblocksReceive(t *testing.T) {
	sets := map[string][]netip.Addr{"one-socket": {lo1}, "two-sockets": {lo1, lo2}}
	if hasIPv6Loopback() {
		sets["ipv6"] = []netip.Addr{lo6}
		sets["dual"] = []netip.Addr{lo1, lo6}
	}
	for name, addrs := range sets {
		t.Run(name, func(t *testing.T) {
			c, err := OpenUDP(UDPConfig{Addrs: addrs})
			require.NoError(t, err)
			testCloseUnblocks(t, c)
			require.ErrorIs(t, c.Send([][]byte{{1}}, Endpoint{Remote: ap("127.0.0.1:9")}), net.ErrClosed)
		})
	}
}

func TestUDPEnvSwitches(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("offloads are Linux-only")
	}
	t.Setenv("RXED_NO_GSO", "1")
	t.Setenv("RXED_NO_GRO", "1")
	a := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo1}})
	b := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo1}})
	bufs := make([][]byte, 10)
	for i := range bufs {
		bufs[i] = payload(i, 500)
	}
	require.NoError(t, a.Send(bufs, Endpoint{Remote: b.LocalAddrs()[0]}))
	got := receiveN(t, b, 10, 500)
	for i := range bufs {
		require.Equal(t, bufs[i], got[i].data)
	}
	require.Zero(t, a.(StatsReporter).Stats().GSOSends)
	require.Zero(t, b.(StatsReporter).Stats().GROReceives)
}

func TestUDPSteadyStateAllocs(t *testing.T) {
	modes := append([]offloadMode{}, offloadModes...)
	modes = append(modes, offloadMode{name: "two-sockets"}) // reader goroutines + hand-off
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			a := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo1}, DisableGSO: m.noGSO, DisableGRO: m.noGRO})
			rxAddrs := []netip.Addr{lo1}
			if m.name == "two-sockets" {
				rxAddrs = []netip.Addr{lo1, lo2}
			}
			b := openTestUDP(t, UDPConfig{Addrs: rxAddrs, DisableGSO: m.noGSO, DisableGRO: m.noGRO})
			bufs := make([][]byte, 32)
			for i := range bufs {
				bufs[i] = payload(i, 1024)
			}
			r := newRxSet(64, 2048)
			ep := Endpoint{Remote: b.LocalAddrs()[0]}
			g := guardReceives(t, b)
			round := func() {
				if err := a.Send(bufs, ep); err != nil {
					t.Fatal(err)
				}
				for got := 0; got < len(bufs); {
					n, err := b.Receive(r.bufs, r.sizes, r.eps)
					g.noError(t, err, "steady-state round")
					got += n
					g.progress()
				}
			}
			for range 10 {
				round()
			}
			// The reader goroutines and the runtime's netpoller may allocate
			// now and then (e.g. a goroutine stack growth); per packet it
			// must be nothing.
			allocs := testing.AllocsPerRun(50, round)
			t.Logf("%.2f allocs per round of %d datagrams", allocs, len(bufs))
			require.Less(t, allocs/float64(len(bufs)), 0.05, "allocations per datagram")
		})
	}
}

// TestUDPWildcardBound: a socket bound to 0.0.0.0 learns each datagram's
// destination from IP_PKTINFO and sends from the address the caller names.
// (Traffic is loopback only; the wildcard socket merely listens.)
func TestUDPWildcardBound(t *testing.T) {
	w := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{netip.IPv4Unspecified()}})
	port := w.LocalAddrs()[0].Port()
	cli := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo1}})
	for _, dst := range []netip.Addr{lo2, lo1, netip.MustParseAddr("127.0.0.3")} {
		require.NoError(t, cli.Send([][]byte{dst.AsSlice()}, Endpoint{Remote: netip.AddrPortFrom(dst, port)}))
		got := receiveN(t, w, 1, 64)
		require.Equal(t, netip.AddrPortFrom(dst, port), got[0].ep.Local)
		// Reply from exactly that address, in a batch that GSO may pack.
		require.NoError(t, w.Send([][]byte{{1, 2}, {3, 4}}, got[0].ep)) // a received Endpoint is already the reply's
		back := receiveN(t, cli, 2, 64)
		require.Equal(t, netip.AddrPortFrom(dst, port), back[0].ep.Remote)
		require.Equal(t, netip.AddrPortFrom(dst, port), back[1].ep.Remote)
		require.Equal(t, []byte{3, 4}, back[1].data)
	}
}

// TestNextDropsOversizeDatagrams: a datagram longer than MaxDatagramSize
// is dropped and counted however it arrived: truncated by the kernel
// (MSG_TRUNC, a socket without GRO), whole in a GRO socket's 64 KiB slot,
// or as segments of a coalesced message whose segment size is over the
// limit; the others of the batch are handed out, split at their segment
// size.
//
// Bug (found by the transport audit, session AF): with GRO on (the
// default), a socket's slots are 64 KiB, the kernel truncates nothing
// shorter, and the Conn lent datagrams of up to 64 KiB that the same
// socket without GRO drops as oversize; the pcap recorder then left them
// out of the capture (record skips anything over MaxDatagramSize).
func TestNextDropsOversizeDatagrams(t *testing.T) {
	big := MaxDatagramSize + 1
	for _, tc := range []struct {
		name      string
		msgs      []rxMsg
		want      []int // lengths handed out
		wantDrops uint64
	}{
		{name: "fits", msgs: []rxMsg{{data: make([]byte, MaxDatagramSize)}}, want: []int{MaxDatagramSize}},
		{name: "truncated", msgs: []rxMsg{{data: make([]byte, MaxDatagramSize), trunc: true}, {data: make([]byte, 5)}},
			want: []int{5}, wantDrops: 1},
		{name: "whole in a GRO slot", msgs: []rxMsg{{data: make([]byte, 100)}, {data: make([]byte, big)}, {data: make([]byte, 7)}},
			want: []int{100, 7}, wantDrops: 1},
		{name: "coalesced, segments over the limit", msgs: []rxMsg{{data: make([]byte, 2*big+10), segSize: big}, {data: make([]byte, 3)}},
			want: []int{10, 3}, wantDrops: 2},
		{name: "coalesced, segments within it", msgs: []rxMsg{{data: make([]byte, 3*1000+1), segSize: 1000}},
			want: []int{1000, 1000, 1000, 1}},
		{name: "only oversize", msgs: []rxMsg{{data: make([]byte, big)}}, wantDrops: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &udpSocket{local: ap("127.0.0.1:4791"), free: newBatchPool()}
			c := &udpConn{}
			b := &rxBatch{sock: s, msgs: tc.msgs}
			b.lease.home = b
			c.open(b, len(tc.msgs))
			pkts := make([][]byte, 16)
			eps := make([]Endpoint, 16)
			leases := make([]*Lease, 16)
			n := c.lend(pkts, eps, leases)
			var got []int
			for i := range n {
				got = append(got, len(pkts[i]))
				leases[i].Release()
			}
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.wantDrops, c.stats.dropOversize.Load())
			require.Nil(t, c.cur, "the batch is used up")
			require.Same(t, b, s.free.tryGet(), "and back in its pool")
		})
	}
}

// TestUDPOversizeDroppedInEveryMode: a datagram over MaxDatagramSize from
// another sender is dropped and counted whether the receiving socket has
// GRO or not, lent (ReceiveLent) or copied into buffers that would hold it.
func TestUDPOversizeDroppedInEveryMode(t *testing.T) {
	for _, m := range offloadModes {
		t.Run(m.name, func(t *testing.T) {
			b := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo1}, DisableGSO: m.noGSO, DisableGRO: m.noGRO})
			raw, err := net.ListenUDP("udp4", &net.UDPAddr{IP: lo1.AsSlice()})
			require.NoError(t, err)
			defer raw.Close()
			for _, l := range []int{MaxDatagramSize + 100, 100, MaxDatagramSize + 1, 200} {
				_, err = raw.WriteToUDPAddrPort(payload(l%250, l), b.LocalAddrs()[0])
				require.NoError(t, err)
			}
			pkts := make([][]byte, 4)
			eps := make([]Endpoint, 4)
			leases := make([]*Lease, 4)
			n, err := b.(Lender).ReceiveLent(pkts, eps, leases)
			require.NoError(t, err)
			require.Positive(t, n)
			require.Equal(t, payload(100, 100), pkts[0])
			for i := range n {
				leases[i].Release()
			}
			if n == 1 { // the rest came in another batch
				got := receiveN(t, b, 1, 1<<16)
				require.Equal(t, payload(200, 200), got[0].data)
			} else {
				require.Equal(t, 2, n)
				require.Equal(t, payload(200, 200), pkts[1])
			}
			require.Equal(t, uint64(2), b.(StatsReporter).Stats().DropOversize)
		})
	}
}
