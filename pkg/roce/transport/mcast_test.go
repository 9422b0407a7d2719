package transport

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// MemNetwork groups: every member receives a group's datagram with Local
// the group (the sender too when it is a member, as IP_MULTICAST_LOOP),
// non-members and other ports do not, Leave and Close end membership.
func TestMemNetworkGroups(t *testing.T) {
	n := NewMemNetwork()
	listen := func(s string) Conn {
		c, err := n.Listen(ap(s))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b, c := listen("10.1.0.1:4791"), listen("10.1.0.2:4791"), listen("10.1.0.3:4791")
	other := listen("10.1.0.4:5000") // same group, other port
	group := netip.MustParseAddr("239.1.1.1")
	mem := map[Conn]*Membership{}
	for _, x := range []Conn{a, b, other} {
		m, err := JoinGroup(x, netip.MustParseAddr("::ffff:239.1.1.1"))
		require.NoError(t, err)
		require.Nil(t, m.Conn, "MemNetwork delivers through the Conn itself")
		require.Equal(t, group, m.Group)
		mem[x] = m
	}
	_, err := JoinGroup(a, group)
	require.Error(t, err, "joining twice")

	require.NoError(t, a.Send([][]byte{payload(1, 100), payload(2, 50)}, Endpoint{Remote: ap("239.1.1.1:4791")}))
	for _, x := range []Conn{a, b} {
		got := receiveN(t, x, 2, MaxDatagramSize)
		for i, p := range got {
			require.Equal(t, payload(i+1, len(p.data)), p.data)
			require.Equal(t, Endpoint{Local: ap("239.1.1.1:4791"), Remote: ap("10.1.0.1:4791")}, p.ep)
		}
	}
	// c sends too (a non-member may send to a group).
	require.NoError(t, c.Send([][]byte{payload(3, 10)}, Endpoint{Remote: ap("239.1.1.1:4791")}))
	for _, x := range []Conn{a, b} {
		got := receiveN(t, x, 1, MaxDatagramSize)
		require.Equal(t, ap("10.1.0.3:4791"), got[0].ep.Remote)
	}

	require.NoError(t, mem[b].Leave())
	require.NoError(t, mem[b].Leave(), "Leave twice")
	require.NoError(t, b.Close())
	require.NoError(t, c.Send([][]byte{payload(4, 10)}, Endpoint{Remote: ap("239.1.1.1:4791")}))
	got := receiveN(t, a, 1, MaxDatagramSize)
	require.Equal(t, payload(4, 10), got[0].data)

	// Nobody left on the group after a closes: no route.
	require.NoError(t, a.Close())
	before := c.(StatsReporter).Stats().DropNoRoute
	require.NoError(t, c.Send([][]byte{payload(5, 10)}, Endpoint{Remote: ap("239.1.1.1:4791")}))
	require.Equal(t, before+1, c.(StatsReporter).Stats().DropNoRoute)
	// other (port 5000) got none of the port-4791 datagrams: send one to
	// its port and see it first.
	require.NoError(t, c.Send([][]byte{payload(6, 10)}, Endpoint{Remote: ap("239.1.1.1:5000")}))
	got = receiveN(t, other, 1, MaxDatagramSize)
	require.Equal(t, payload(6, 10), got[0].data)
}

// JoinGroup refuses unicast addresses, Conns of the other family and
// Conns that cannot join; it finds the joiner inside the wrappers.
func TestJoinGroupBadInputAndWrappers(t *testing.T) {
	n := NewMemNetwork()
	c, err := n.Listen(ap("10.2.0.1:4791"))
	require.NoError(t, err)
	defer c.Close()
	_, err = JoinGroup(c, netip.MustParseAddr("10.2.0.9"))
	require.ErrorIs(t, err, ErrNotGroup)
	_, err = JoinGroup(c, netip.Addr{})
	require.ErrorIs(t, err, ErrNotGroup)
	_, err = JoinGroup(c, netip.MustParseAddr("ff0e::1"))
	require.Error(t, err, "IPv6 group on an IPv4 Conn")
	_, err = JoinGroup(struct{ Conn }{c}, netip.MustParseAddr("239.0.0.1"))
	require.ErrorIs(t, err, ErrNoMulticast, "a foreign wrapper hides the joiner")

	f := NewFaulty(c, FaultConfig{})
	defer f.Close()
	m, err := JoinGroup(f, netip.MustParseAddr("239.0.0.1"))
	require.NoError(t, err)
	require.NoError(t, m.Leave())

	require.True(t, IsGroup(netip.MustParseAddr("::ffff:224.0.0.1")))
	require.True(t, IsGroup(netip.MustParseAddr("ff02::1")))
	require.False(t, IsGroup(netip.MustParseAddr("::ffff:10.0.0.1")))
	require.False(t, IsGroup(netip.MustParseAddr("fe80::1")))
}

// TestMembershipLeaveClosesItsConn: a Membership a GroupJoiner of another
// package made (it cannot set this package's leave) has its Conn closed by
// Leave, as Leave's doc says, once however often it is called, so the
// engine's reader of that Conn ends. Without it the engine's group loop
// read such a Conn for ever (goroutine audit, session AG).
func TestMembershipLeaveClosesItsConn(t *testing.T) {
	n := NewMemNetwork()
	c, err := n.Listen(ap("10.1.0.1:4791"))
	require.NoError(t, err)
	m := &Membership{Group: netip.MustParseAddr("239.1.1.1"), Conn: c}
	require.NoError(t, m.Leave())
	require.NoError(t, m.Leave())
	// Closed: the address is free again (a Receive would wait for ever
	// on an open one).
	again, err := n.Listen(ap("10.1.0.1:4791"))
	require.NoError(t, err, "Leave left its Conn open")
	again.Close()
}
