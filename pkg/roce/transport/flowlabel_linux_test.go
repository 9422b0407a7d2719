//go:build linux

package transport

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// autoFlowLabels is net.ipv6.auto_flowlabels ("" if unreadable): 1 (the
// default) labels a socket's datagrams unless it opts out, 3 forces it.
func autoFlowLabels() string {
	b, err := os.ReadFile("/proc/sys/net/ipv6/auto_flowlabels")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// flowInfoReceiver is a plain IPv6 UDP socket on ::1 that has recvmsg
// report each datagram's flow info (IPV6_FLOWINFO), and its traffic
// class, as a peer's kernel sees them.
type flowInfoReceiver struct {
	fd   int
	port uint16
}

func openFlowInfoReceiver(t *testing.T) *flowInfoReceiver {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	require.NoError(t, unix.Bind(fd, &unix.SockaddrInet6{Addr: lo6.As16()}))
	require.NoError(t, unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, ipv6FlowInfo, 1))
	require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 10}))
	sa, err := unix.Getsockname(fd)
	require.NoError(t, err)
	return &flowInfoReceiver{fd: fd, port: uint16(sa.(*unix.SockaddrInet6).Port)}
}

// next receives one datagram and returns the flow info its header had
// (0 when the kernel sent no IPV6_FLOWINFO message: it omits a zero one).
func (r *flowInfoReceiver) next(t *testing.T) uint32 {
	t.Helper()
	buf, oob := make([]byte, 2048), make([]byte, 256)
	_, oobn, _, _, err := unix.Recvmsg(r.fd, buf, oob, 0)
	require.NoError(t, err, "no datagram on [::1]:%d", r.port)
	cms, err := unix.ParseSocketControlMessage(oob[:oobn])
	require.NoError(t, err)
	for _, c := range cms {
		if c.Header.Level == unix.IPPROTO_IPV6 && c.Header.Type == ipv6FlowInfo {
			return binary.BigEndian.Uint32(c.Data)
		}
	}
	return 0
}

// TestKernelSendsFlowLabelZero: rxed's IPv6 datagrams leave with flow
// label 0, as rxe's (prepare6: ip6_flow_hdr(ip6h, prio, htonl(0)); every
// IPv6 frame of shared/pcaps' rxe captures has flow label 0), alone and
// with a traffic class. Bug (IPv6 traffic parity, item 2, session O):
// Linux labels a UDP socket's datagrams with a hash of the flow unless
// the socket opts out (net.ipv6.auto_flowlabels=1, the default), so
// rxed's carried labels rxe never sends. A plain socket's datagram shows
// the premise: it is labelled.
func TestKernelSendsFlowLabelZero(t *testing.T) {
	if !hasIPv6Loopback() {
		t.Skip("no IPv6 loopback")
	}
	auto := autoFlowLabels()
	if auto == "3" {
		t.Skip("net.ipv6.auto_flowlabels=3 forces a label on every datagram")
	}
	r := openFlowInfoReceiver(t)
	to := netip.AddrPortFrom(lo6, r.port)

	if auto == "1" {
		plain, err := net.DialUDP("udp6", nil, net.UDPAddrFromAddrPort(to))
		require.NoError(t, err)
		defer plain.Close()
		_, err = plain.Write([]byte{1})
		require.NoError(t, err)
		require.NotZero(t, r.next(t)&ipv6FlowLabelMask, "a plain socket's datagram (auto_flowlabels=1) is labelled")
	}

	c := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo6}})
	for _, class := range []uint8{0, 0x68} {
		require.NoError(t, c.Send([][]byte{payload(int(class), 100)}, Endpoint{Remote: to, TrafficClass: class}))
		info := r.next(t)
		require.Equal(t, uint32(0), info&ipv6FlowLabelMask, "flow label (class %#x; flow info %#08x)", class, info)
		require.Equal(t, uint32(class), info>>20, "traffic class")
	}
}
