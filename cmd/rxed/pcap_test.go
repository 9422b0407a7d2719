package main

import (
	"errors"
	"io"
	"os"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/stretchr/testify/require"
)

// TestPcapFlag: --pcap records the engine's RoCEv2 traffic, both ways.
func TestPcapFlag(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port := reservePort(t)
	capture := tempPath(t, "client.pcap")
	srv, cli := runPair(t, []string{"pingpong", "--addr", a, "-p", port, "-n", "10", "-s", "100"}, "local address",
		[]string{"pingpong", "--addr", b, "-p", port, "-n", "10", "-s", "100", "--pcap", capture, "127.0.0.1"})
	requireOK(t, "server", srv)
	requireOK(t, "client", cli)
	f, err := os.Open(capture)
	require.NoError(t, err)
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	require.NoError(t, err)
	sent, rcvd := 0, 0
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		p := gopacket.NewPacket(data, r.LinkType(), gopacket.Default)
		ip, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		require.True(t, ok, "not IPv4: %v", p)
		udp, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
		require.True(t, ok)
		require.EqualValues(t, 4791, udp.DstPort)
		switch ip.SrcIP.String() {
		case b:
			sent++
		case a:
			rcvd++
		default:
			t.Fatalf("packet from %v", ip.SrcIP)
		}
	}
	// 10 SENDs each way, and the ACKs of ours.
	require.GreaterOrEqual(t, sent, 10)
	require.GreaterOrEqual(t, rcvd, 10)
}
