//go:build linux

package transport

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/internal/netns"
	"github.com/rxed/rxed/internal/testenv"
)

// TestWildcardSendsLinkLocalOnTheSourcesInterface: a Conn bound to :: in
// namespace W, which has two veth links, w1 (fe80::1) to namespace A and
// w2 (fe80::2) to namespace C, where A and C both have fe80::a. A send to
// fe80::a (no zone, as GIDs carry none) leaves on the interface of the
// source address the caller names: from fe80::1 it reaches A, from
// fe80::2 it reaches C. What W receives reports the destination it was
// sent to and the sender, zone-free.
//
// Bug (link-local from a socket bound to ::, lead's task list): the
// IPV6_PKTINFO named the link-local source without an interface, which
// the kernel refuses (EINVAL); DESIGN.md told users to bind with a zone.
func TestWildcardSendsLinkLocalOnTheSourcesInterface(t *testing.T) {
	why := netns.Available()
	testenv.Need(t, why == "", "%s", why)
	nss := map[string]*netns.NS{}
	for _, name := range []string{"w", "a", "c"} {
		ns, err := netns.Create(fmt.Sprintf("rxed-wll%s-%d", name, os.Getpid()))
		require.NoError(t, err)
		t.Cleanup(func() { ns.Delete() })
		nss[name] = ns
	}
	w, a, c := nss["w"], nss["a"], nss["c"]
	require.NoError(t, w.IP("link", "add", "w1", "type", "veth", "peer", "name", "va", "netns", a.Name))
	require.NoError(t, w.IP("link", "add", "w2", "type", "veth", "peer", "name", "vc", "netns", c.Name))
	ends := []struct {
		ns        *netns.NS
		dev, addr string
	}{{w, "w1", "fe80::1"}, {w, "w2", "fe80::2"}, {a, "va", "fe80::a"}, {c, "vc", "fe80::a"}}
	for _, e := range ends {
		require.NoError(t, e.ns.IP("addr", "add", e.addr+"/64", "dev", e.dev, "nodad"))
		require.NoError(t, e.ns.IP("link", "set", e.dev, "up"))
	}
	for _, e := range ends { // the carrier comes a moment after both ends are up
		require.Eventually(t, func() bool {
			out, err := e.ns.Command(context.Background(), "cat", "/sys/class/net/"+e.dev+"/operstate").Output()
			return err == nil && strings.TrimSpace(string(out)) == "up"
		}, 10*time.Second, 10*time.Millisecond, "%s never came up", e.dev)
	}
	open := func(ns *netns.NS, cfg UDPConfig) Conn {
		var conn Conn
		require.NoError(t, ns.Do(func() error { // the socket stays in the namespace
			var err error
			conn, err = OpenUDP(cfg)
			return err
		}))
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	wc := open(w, UDPConfig{Addrs: []netip.Addr{netip.IPv6Unspecified()}})
	wport := wc.LocalAddrs()[0].Port()
	ac := open(a, UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr("fe80::a%va")}, Port: int(wport)})
	cc := open(c, UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr("fe80::a%vc")}, Port: int(wport)})
	fa := netip.AddrPortFrom(netip.MustParseAddr("fe80::a"), wport)

	for _, tc := range []struct {
		from string
		peer Conn
	}{{"fe80::1", ac}, {"fe80::2", cc}} {
		from := netip.AddrPortFrom(netip.MustParseAddr(tc.from), wport)
		// Two datagrams, so that GSO may carry them as one message.
		require.NoError(t, wc.Send([][]byte{[]byte("from " + tc.from), []byte("more")}, Endpoint{Local: from, Remote: fa}), "from %s", tc.from)
		got := receiveN(t, tc.peer, 2, 64)
		require.Equal(t, "from "+tc.from, string(got[0].data))
		require.Equal(t, from, got[0].ep.Remote)
		require.Equal(t, fa, got[0].ep.Local)
		// The answer: W reports where it came to and from whom.
		require.NoError(t, tc.peer.Send([][]byte{[]byte("to " + tc.from)}, Endpoint{Remote: from}))
		back := receiveN(t, wc, 1, 64)
		require.Equal(t, "to "+tc.from, string(back[0].data))
		require.Equal(t, Endpoint{Local: from, Remote: fa}, back[0].ep)
	}
}
