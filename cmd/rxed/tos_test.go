package main

import (
	"errors"
	"io"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/wire"
)

// rocePacket is what the TOS tests read of one captured RoCEv2 packet.
type rocePacket struct {
	src, dst netip.Addr
	tos      uint8 // IPv4 TOS, IPv6 traffic class
	opcode   wire.Opcode
	destQP   uint32
}

// capturedRoCE reads the RoCEv2 packets of a --pcap file.
func capturedRoCE(t *testing.T, path string) []rocePacket {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	require.NoError(t, err)
	var out []rocePacket
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		p := gopacket.NewPacket(data, r.LinkType(), gopacket.Default)
		var rp rocePacket
		switch ip := p.NetworkLayer().(type) {
		case *layers.IPv4:
			rp.src, _ = netip.AddrFromSlice(ip.SrcIP.To4())
			rp.dst, _ = netip.AddrFromSlice(ip.DstIP.To4())
			rp.tos = ip.TOS
		case *layers.IPv6:
			rp.src, _ = netip.AddrFromSlice(ip.SrcIP)
			rp.dst, _ = netip.AddrFromSlice(ip.DstIP)
			rp.tos = ip.TrafficClass
		default:
			t.Fatalf("%s: not IP: %v", path, p)
		}
		udp, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
		require.True(t, ok, "%s: not UDP: %v", path, p)
		bth := wire.BTH(udp.Payload)
		require.GreaterOrEqual(t, len(udp.Payload), 12, "%s: no BTH", path)
		rp.opcode, rp.destQP = bth.Opcode(), bth.DestQP()
		out = append(out, rp)
	}
}

// tosOfSent is the TOS of every packet from src to a QP other than QP 1
// (the connection manager's MADs), by count.
func tosOfSent(pkts []rocePacket, src string) map[uint8]int {
	m := map[uint8]int{}
	for _, p := range pkts {
		if p.src.String() == src && p.destQP != 1 {
			m[p.tos]++
		}
	}
	return m
}

// TestTOSFlagParsing: ucmatose's and udaddy's -t, perftest's -T/--tos and
// --tclass take a byte in any base strtoul(..., 0) reads and refuse the
// rest (the C tools truncate to a byte). Task: tools' flags for the
// session's TOS features.
func TestTOSFlagParsing(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint8
		err  string
	}{
		{"0", 0, ""},
		{"104", 104, ""},
		{"0x68", 0x68, ""},
		{"0150", 0o150, ""},
		{"255", 255, ""},
		{"0xff", 255, ""},
		{"256", 0, "256 out of range 0..255"},
		{"-1", 0, "not a number"},
		{"ef", 0, "not a number"},
		{"", 0, "not a number"},
	} {
		var f tosFlag
		err := f.Set(tc.in)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, "%q", tc.in)
			require.False(t, f.set, "%q", tc.in)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		require.Equal(t, tc.want, f.v, "%q", tc.in)
		require.True(t, f.set, "%q", tc.in)
	}
}

func TestCmaToolsTOSFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want uint8
		err  string
	}{
		{[]string{"cmatose", "-b", "127.0.0.1"}, 0, ""},
		{[]string{"cmatose", "-b", "127.0.0.1", "-t", "104"}, 104, ""},
		{[]string{"cmatose", "-s", "127.0.0.1", "-t", "0x68"}, 104, ""},
		{[]string{"udaddy", "-s", "127.0.0.1", "-t", "0xb8"}, 0xb8, ""},
		{[]string{"cmatose", "-b", "127.0.0.1", "-t", "300"}, 0, "invalid value \"300\" for flag -t: 300 out of range 0..255"},
		{[]string{"udaddy", "-b", "127.0.0.1", "-t", "cs1"}, 0, "invalid value \"cs1\" for flag -t: not a number"},
	} {
		var stderr strings.Builder
		o, code, ok := parseCma(tc.args[0], tc.args[0], cmatosePort, tc.args[1:], &stderr)
		if tc.err != "" {
			require.False(t, ok, "%v", tc.args)
			require.Equal(t, 2, code, "%v", tc.args)
			require.Contains(t, stderr.String(), tc.err, "%v", tc.args)
			continue
		}
		require.True(t, ok, "%v: %s", tc.args, stderr.String())
		require.Equal(t, tc.want, o.tos.v, "%v", tc.args)
		require.Equal(t, tc.want, cmaParams(netip.Addr{}, o).tos, "%v: the connect parameters carry it", tc.args)
	}
}

// TestCmatoseTOS: ucmatose -t sets the client's connections' TOS
// (rdma_set_option RDMA_OPTION_ID_TOS): the REQ carries it as the path's
// traffic class, so every packet of the connection carries it, the
// server's SENDs and ACKs included. Task: connParam passed no TOS.
func TestCmatoseTOS(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	spcap, cpcap := tempPath(t, "server.pcap"), tempPath(t, "client.pcap")
	srv, cli := runToolPair(t,
		[]string{"cmatose", "-b", a, "-C", "3", "--timeout", "20s", "--pcap", spcap}, "cmatose: starting server",
		[]string{"cmatose", "-s", a, "-b", b, "-C", "3", "-t", "104", "--timeout", "20s", "--pcap", cpcap})
	requireOK(t, "server", srv)
	requireOK(t, "client", cli)
	// 3 SENDs each way and their ACKs, every one with TOS 104.
	sent := tosOfSent(capturedRoCE(t, cpcap), b)
	require.Len(t, sent, 1, "the client's packets: TOS -> count %v", sent)
	require.GreaterOrEqual(t, sent[104], 3, "the client's packets: TOS -> count %v", sent)
	sent = tosOfSent(capturedRoCE(t, spcap), a)
	require.Len(t, sent, 1, "the server's packets: TOS -> count %v", sent)
	require.GreaterOrEqual(t, sent[104], 3, "the server's packets: TOS -> count %v", sent)
}

// TestUdaddyTOS: udaddy -t sets the client's address handle's traffic
// class (rdma_cm's ud.ah_attr), so its datagrams carry the TOS, and the
// server, whose reply handle comes from the received GRH
// (ibv_create_ah_from_wc), answers with the same. Task: cmDialUD copied
// only the GID, QPN and Q_Key of UDRemote.
func TestUdaddyTOS(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	spcap, cpcap := tempPath(t, "server.pcap"), tempPath(t, "client.pcap")
	srv, cli := runToolPair(t,
		[]string{"udaddy", "-b", a, "-C", "4", "--timeout", "20s", "--pcap", spcap}, "udaddy: starting server",
		[]string{"udaddy", "-s", a, "-b", b, "-C", "4", "-t", "0x68", "--timeout", "20s", "--pcap", cpcap})
	requireOK(t, "server", srv)
	requireOK(t, "client", cli)
	require.Equal(t, map[uint8]int{0x68: 4}, tosOfSent(capturedRoCE(t, cpcap), b), "the client's datagrams")
	require.Equal(t, map[uint8]int{0x68: 4}, tosOfSent(capturedRoCE(t, spcap), a), "the server's replies")
}

// TestGRHSource: the sender and traffic class of a received GRH, IPv4
// (rxe's 20 zero bytes, then the IP header) and IPv6.
func TestGRHSource(t *testing.T) {
	v4 := make([]byte, grhLen)
	v4[grhV4Header] = 0x45
	v4[grhV4TOS] = 0xb8
	copy(v4[grhV4Src:], []byte{10, 1, 2, 3})
	src, tc, ok := grhSource(v4)
	require.True(t, ok)
	require.Equal(t, netip.MustParseAddr("10.1.2.3"), src)
	require.EqualValues(t, 0xb8, tc)

	v6 := make([]byte, grhLen)
	copy(v6, []byte{0x66, 0x85, 0x43, 0x21}) // version 6, traffic class 0x68, flow label 0x54321
	want := netip.MustParseAddr("fd00::7")
	copy(v6[grhV6SGID:], want.AsSlice())
	src, tc, ok = grhSource(v6)
	require.True(t, ok)
	require.Equal(t, want, src)
	require.EqualValues(t, 0x68, tc)

	_, _, ok = grhSource(make([]byte, grhLen))
	require.False(t, ok, "neither IPv4 nor IPv6")
}

// TestPerfTOSFlags: perftest's -T/--tos only with -R (perftest: "TOS only
// valid for rdma_cm based QP and RawEth QP"), --tclass only without it
// (perftest sets it in ctx_modify_qp_to_rtr, which -R skips), both a
// byte. Task: tools' flags for the session's TOS features. With -R,
// --tclass is taken and has no effect, as in perftest, and perf says so
// (it was refused, so a perftest command line with both failed here).
func TestPerfTOSFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args        []string
		tos, tclass uint8
		err         string
	}{
		{[]string{"write", "--addr", "127.0.0.1"}, 0, 0, ""},
		{[]string{"write", "--addr", "127.0.0.1", "-R", "-T", "0x68"}, 104, 0, ""},
		{[]string{"write", "--addr", "127.0.0.1", "-R", "--tos", "184"}, 184, 0, ""},
		{[]string{"send", "--addr", "127.0.0.1", "-c", "UD", "--tclass", "0x68"}, 0, 104, ""},
		{[]string{"write", "--addr", "127.0.0.1", "--tclass", "0", "127.0.0.2"}, 0, 0, ""},
		{[]string{"write", "--addr", "127.0.0.1", "-T", "104"}, 0, 0, "-T 104: the TOS of rdma_cm connections, only with -R"},
		{[]string{"write", "--addr", "127.0.0.1", "-R", "-T", "256"}, 0, 0, "invalid value \"256\" for flag -T: 256 out of range 0..255"},
		{[]string{"write", "--addr", "127.0.0.1", "--tclass", "x"}, 0, 0, "invalid value \"x\" for flag -tclass: not a number"},
	} {
		var stderr strings.Builder
		o, code, ok := parsePerf(tc.args, &stderr)
		if tc.err != "" {
			require.False(t, ok, "%v", tc.args)
			require.Equal(t, 2, code, "%v", tc.args)
			require.Contains(t, stderr.String(), tc.err, "%v", tc.args)
			continue
		}
		require.True(t, ok, "%v: %s", tc.args, stderr.String())
		require.Empty(t, stderr.String(), "%v", tc.args)
		require.Equal(t, tc.tos, o.tos.v, "%v: -T", tc.args)
		require.Equal(t, tc.tclass, o.tclass.v, "%v: --tclass", tc.args)
		if o.rdmaCM {
			s := &perfCM{r: &perfRun{o: o}}
			require.Equal(t, tc.tos, s.cmParamsFor(true).tos, "%v: the test connections' TOS", tc.args)
			require.Zero(t, s.cmParamsFor(false).tos, "%v: the control connection keeps TOS 0", tc.args)
		}
	}
	var stderr strings.Builder
	o, _, ok := parsePerf([]string{"write", "--addr", "127.0.0.1", "-R", "-T", "0x28", "--tclass", "104"}, &stderr)
	require.True(t, ok, "-R with --tclass runs, as perftest's: %s", stderr.String())
	require.Contains(t, stderr.String(), "--tclass 104 has no effect with -R")
	require.Zero(t, o.tclass.v, "no QP takes --tclass with -R")
	require.Equal(t, uint8(0x28), (&perfCM{r: &perfRun{o: o}}).cmParamsFor(true).tos, "-T still sets the test connections' TOS")
}

// tosByDestQP is the TOS of every packet from src to a QP other than QP
// 1, by destination QP, and the destination QPs of RDMA WRITEs.
func tosByDestQP(pkts []rocePacket, src string) (tos map[uint32]map[uint8]int, writes map[uint32]bool) {
	tos, writes = map[uint32]map[uint8]int{}, map[uint32]bool{}
	for _, p := range pkts {
		if p.src.String() != src || p.destQP == 1 {
			continue
		}
		if tos[p.destQP] == nil {
			tos[p.destQP] = map[uint8]int{}
		}
		tos[p.destQP][p.tos]++
		switch p.opcode {
		case wire.RCWriteFirst, wire.RCWriteMiddle, wire.RCWriteLast, wire.RCWriteOnly:
			writes[p.destQP] = true
		}
	}
	return tos, writes
}

// TestPerfRDMACMTOS: perf -R -T sets the client's test connection's TOS,
// as perftest's rdma_set_option(RDMA_OPTION_ID_TOS): the test QPs carry it
// both ways (the server's QP takes the REQ's traffic class), the control
// connection keeps TOS 0. Task: connParam passed no TOS.
func TestPerfRDMACMTOS(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	spcap, cpcap := tempPath(t, "server.pcap"), tempPath(t, "client.pcap")
	common := []string{"-R", "--timeout", "20s", "--progress", "0", "-s", "4096", "-n", "50"}
	srv, cli := runPair(t,
		append([]string{"perf", "write", "--addr", a, "--pcap", spcap}, common...), "Waiting for client",
		append(append([]string{"perf", "write", "--addr", b, "--pcap", cpcap, "-T", "0x68"}, common...), a))
	requireOK(t, "server", srv)
	requireOK(t, "client", cli)
	for _, side := range []struct{ name, pcap, src string }{{"client", cpcap, b}, {"server", spcap, a}} {
		tos, writes := tosByDestQP(capturedRoCE(t, side.pcap), side.src)
		require.Len(t, tos, 2, "%s: the control and the test connection: dest QP -> TOS -> count %v", side.name, tos)
		var test, ctrl int
		for qpn, m := range tos {
			require.Len(t, m, 1, "%s: QP %#x: one TOS per connection: %v", side.name, qpn, tos)
			switch {
			case m[0x68] > 0:
				test++
			case m[0] > 0:
				ctrl++
			}
		}
		require.Equal(t, 1, test, "%s: the test connection has TOS 0x68: %v", side.name, tos)
		require.Equal(t, 1, ctrl, "%s: the control connection TOS 0: %v", side.name, tos)
		for qpn := range writes {
			require.Positive(t, tos[qpn][0x68], "%s: the WRITEs to QP %#x carry TOS 0x68: %v", side.name, qpn, tos)
		}
		if side.name == "client" {
			require.Len(t, writes, 1, "the client WRITEs to the server's test QP")
		}
	}
}

// TestPerfTclass: perf --tclass is the traffic class of this side's QPs
// connected over TCP, as perftest's ctx_modify_qp_to_rtr: each side's
// packets carry its own (RC: the QP's AV; UD: the address handle's).
// Task: tools' flags for the session's TOS features.
func TestPerfTclass(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		args           []string
		server, client map[uint8]int // TOS -> count of the side's packets (nil: not checked)
	}{
		{"write_rc", []string{"write", "-s", "4096", "-n", "50"}, nil, nil},
		{"send_ud", []string{"send", "-c", "UD", "-s", "512", "-n", "40"}, nil, map[uint8]int{0xb8: 40}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b := addrPair(t)
			port := reservePort(t)
			spcap, cpcap := tempPath(t, "server.pcap"), tempPath(t, "client.pcap")
			common := append([]string{"-p", port, "--timeout", "20s", "--progress", "0"}, tc.args[1:]...)
			srv, cli := runPair(t,
				append([]string{"perf", tc.args[0], "--addr", a, "--pcap", spcap, "--tclass", "0x68"}, common...), "Waiting for client",
				append(append([]string{"perf", tc.args[0], "--addr", b, "--pcap", cpcap, "--tclass", "184"}, common...), "127.0.0.1"))
			requireOK(t, "server", srv)
			requireOK(t, "client", cli)
			sent := tosOfSent(capturedRoCE(t, cpcap), b)
			if tc.client != nil {
				require.Equal(t, tc.client, sent, "the client's packets: TOS -> count")
			} else {
				require.Len(t, sent, 1, "the client's packets: TOS -> count %v", sent)
				require.Positive(t, sent[0xb8], "the client's packets: TOS -> count %v", sent)
			}
			if tc.args[0] == "write" {
				sent = tosOfSent(capturedRoCE(t, spcap), a)
				require.Len(t, sent, 1, "the server's ACKs: TOS -> count %v", sent)
				require.Positive(t, sent[0x68], "the server's ACKs: TOS -> count %v", sent)
			}
		})
	}
}
