package conform

import (
	"encoding/binary"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestLinkSendsFlowLabelZero: the conformance link's IPv6 packets leave
// with flow label 0, as rxe's (prepare6: ip6_flow_hdr(ip6h, prio,
// htonl(0))) and the engine's sockets do. Bug (review of session AK):
// the link's socket kept Linux's automatic labels
// (net.ipv6.auto_flowlabels=1, the default), so a crafted packet did not
// leave as rxe's would.
func TestLinkSendsFlowLabelZero(t *testing.T) {
	lo6 := netip.IPv6Loopback()
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet6{Addr: lo6.As16()}); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no IPv6 loopback: %v", err)
		}
		t.Skipf("no IPv6 loopback: %v", err)
	}
	b, _ := os.ReadFile("/proc/sys/net/ipv6/auto_flowlabels")
	if strings.TrimSpace(string(b)) == "3" {
		t.Skip("net.ipv6.auto_flowlabels=3 forces a label on every datagram")
	}
	const ipv6FlowInfo = 11 // IPV6_FLOWINFO: recvmsg reports the header's first word
	require.NoError(t, unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, ipv6FlowInfo, 1))
	require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 10}))
	sa, err := unix.Getsockname(fd)
	require.NoError(t, err)
	peer := netip.AddrPortFrom(lo6, uint16(sa.(*unix.SockaddrInet6).Port))

	l, err := openLinkClock(netip.AddrPortFrom(lo6, 0), peer, realClock{}) // any port: nothing is sealed
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, l.SendRaw([]byte{1, 2, 3, 4}, "flow label probe"))

	buf, oob := make([]byte, 64), make([]byte, 256)
	_, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, 0)
	require.NoError(t, err, "the link's datagram did not arrive")
	cms, err := unix.ParseSocketControlMessage(oob[:oobn])
	require.NoError(t, err)
	for _, c := range cms {
		if c.Header.Level == unix.IPPROTO_IPV6 && c.Header.Type == ipv6FlowInfo {
			// The kernel omits a zero flow info; one sent is the label.
			require.Zero(t, binary.BigEndian.Uint32(c.Data)&0xFFFFF, "flow label")
		}
	}
}
