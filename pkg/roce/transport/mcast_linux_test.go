//go:build linux

package transport

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/rxed/rxed/internal/netns"
	"github.com/rxed/rxed/internal/testenv"
	"github.com/stretchr/testify/require"
)

// UDP multicast on Linux, in a network namespace of its own (loopback
// with multicast on and a route for 224.0.0.0/4): two Conns on
// 127.0.0.1 and 127.0.0.2, both on port 4791, join 239.1.1.1; a datagram
// a third Conn sends to 239.1.1.1:4791 arrives on both memberships'
// Conns with the group as destination (IP_PKTINFO), and on the sender's
// own membership once it joins too (IP_MULTICAST_LOOP). After Leave a
// Conn's membership gets nothing more.
func TestUDPMulticastInNetns(t *testing.T) {
	why := netns.Available()
	testenv.Need(t, why == "", "%s", why)
	ns, err := netns.Create(fmt.Sprintf("rxed-mc-%d", os.Getpid()))
	require.NoError(t, err)
	defer ns.Delete()
	require.NoError(t, ns.LoopbackMulticast())

	var a, b, s Conn
	var ma, mb, ms *Membership
	group := netip.MustParseAddr("239.1.1.1")
	require.NoError(t, ns.Do(func() error {
		var err error
		open := func(addr string) Conn {
			if err != nil {
				return nil
			}
			var c Conn
			c, err = OpenUDP(UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr(addr)}, Port: RoCEv2Port})
			return c
		}
		a, b, s = open("127.0.0.1"), open("127.0.0.2"), open("127.0.0.3")
		if err != nil {
			return err
		}
		if ma, err = JoinGroup(a, group); err != nil {
			return err
		}
		mb, err = JoinGroup(b, group)
		return err
	}))
	defer a.Close()
	defer b.Close()
	defer s.Close()
	defer ma.Leave()
	defer mb.Leave()
	require.NotNil(t, ma.Conn)

	send := func(id int) {
		require.NoError(t, s.Send([][]byte{payload(id, 200)}, Endpoint{Remote: ap("239.1.1.1:4791")}))
	}
	send(1)
	for _, m := range []*Membership{ma, mb} {
		got := receiveN(t, m.Conn, 1, MaxDatagramSize)
		require.Equal(t, payload(1, 200), got[0].data)
		require.Equal(t, Endpoint{Local: ap("239.1.1.1:4791"), Remote: ap("127.0.0.3:4791")}, got[0].ep)
	}

	require.NoError(t, ns.Do(func() error { var err error; ms, err = JoinGroup(s, group); return err }))
	defer ms.Leave()
	require.NoError(t, mb.Leave())
	send(2)
	for _, m := range []*Membership{ma, ms} {
		got := receiveN(t, m.Conn, 1, MaxDatagramSize)
		require.Equal(t, payload(2, 200), got[0].data)
	}
	// The unicast sockets never see group traffic.
	require.NoError(t, s.Send([][]byte{payload(3, 20)}, Endpoint{Remote: ap("127.0.0.1:4791")}))
	got := receiveN(t, a, 1, MaxDatagramSize)
	require.Equal(t, payload(3, 20), got[0].data, "the group's datagrams did not reach the unicast socket")
}

// A PcapRecorder around the Conn that joins records what the membership's
// own Conn receives (the group's datagrams reach the engine there, not
// through the recorder's Receive), in the same capture as the Conn's own
// traffic: a capture of a multicast receiver shows the datagrams it got.
func TestUDPMulticastPcapRecordsGroupReceives(t *testing.T) {
	why := netns.Available()
	testenv.Need(t, why == "", "%s", why)
	ns, err := netns.Create(fmt.Sprintf("rxed-mcp-%d", os.Getpid()))
	require.NoError(t, err)
	defer ns.Delete()
	require.NoError(t, ns.LoopbackMulticast())

	var buf bytes.Buffer
	var rec *PcapRecorder
	var s Conn
	var m *Membership
	group := netip.MustParseAddr("239.1.1.1")
	require.NoError(t, ns.Do(func() error {
		a, err := OpenUDP(UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, Port: RoCEv2Port})
		if err != nil {
			return err
		}
		if rec, err = NewPcapRecorder(a, &buf, PcapOptions{}); err != nil {
			return err
		}
		if s, err = OpenUDP(UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.3")}, Port: RoCEv2Port}); err != nil {
			return err
		}
		m, err = JoinGroup(NewFaulty(rec, FaultConfig{}), group) // through both wrappers
		return err
	}))
	defer rec.Close()
	defer s.Close()
	defer m.Leave()
	_, err = JoinGroup(rec, netip.MustParseAddr("10.0.0.1"))
	require.ErrorIs(t, err, ErrNotGroup)

	require.NoError(t, s.Send([][]byte{payload(7, 200)}, Endpoint{Remote: ap("239.1.1.1:4791")}))
	got := receiveN(t, m.Conn, 1, MaxDatagramSize)
	require.Equal(t, payload(7, 200), got[0].data)
	require.NoError(t, rec.Err())

	r, err := pcapgo.NewReader(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	frame, _, err := r.ReadPacketData()
	require.NoError(t, err)
	p := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	ip, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	require.True(t, ok, "an IPv4 frame")
	require.Equal(t, "127.0.0.3", ip.SrcIP.String())
	require.Equal(t, "239.1.1.1", ip.DstIP.String())
	require.Equal(t, payload(7, 200), p.ApplicationLayer().Payload())
	_, _, err = r.ReadPacketData()
	require.Error(t, err, "exactly one frame")
}
