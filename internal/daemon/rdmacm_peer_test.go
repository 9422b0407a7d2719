package daemon

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// grhSource is a request as cmPeer reads it: the GRH source its REQ came
// from (Request.RemoteQP's GID).
type grhSource netip.Addr

func (g grhSource) RemoteQP() (netip.Addr, uint32) { return netip.Addr(g), 0x11 }

// TestCMPeerKeysOnTheGRHSource: the address the rdma_cm listener keys a
// session on (allowlist, per-source limit, test-connection windows) is
// the one the REQ came from, with the header's port for the logs, even
// when rdma_cm's header names another address. Bug reference: 4d4d567
// (the daemon audit) moved the keying from the header (Request.Remote)
// to the GRH; pkg/rdmacm then began refusing a header that names another
// source (rej_src_mismatch), so every Request the daemon sees has the two
// equal (both unmapped, compared as such: fromHeaderSource), and
// TestRDMACMForgedHeaderSourceGetsNoSession passes with the keying
// switched back. No request through the public API can tell them apart,
// so this hands cmPeer one that pkg/rdmacm would have refused.
func TestCMPeerKeysOnTheGRHSource(t *testing.T) {
	allow := []netip.Prefix{netip.MustParsePrefix("127.0.3.237/32")}
	for _, tc := range []struct {
		name   string
		grh    string
		header string
	}{
		{"header names an allowed address", "127.0.3.238", "127.0.3.237:40000"},
		{"header names another family", "127.0.3.238", "[fe80::1]:40001"},
		{"header names the mapped form of an allowed address", "10.9.9.9", "[::ffff:127.0.3.237]:40002"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			grh, header := netip.MustParseAddr(tc.grh), netip.MustParseAddrPort(tc.header)
			peer, remote := cmPeer(grhSource(grh), header)
			require.Equal(t, grh, peer, "the session's key")
			require.Equal(t, netip.AddrPortFrom(grh, header.Port()), remote, "the address logs name")
			require.False(t, allowed(allow, peer), "a host outside --allow passes it by naming an allowed address")
		})
	}
	// A legitimate client: both agree, and it is let in.
	peer, _ := cmPeer(grhSource(netip.MustParseAddr("127.0.3.237")), netip.MustParseAddrPort("127.0.3.237:40003"))
	require.True(t, allowed(allow, peer))
}
