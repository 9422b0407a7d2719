//go:build linux

package transport

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rxed/rxed/pkg/wire"
)

// Socket options of a flow label's sender (include/uapi/linux/in6.h),
// which x/sys does not name.
const (
	ipv6FlowLabelMgr = 32 // IPV6_FLOWLABEL_MGR: struct in6_flowlabel_req
	ipv6FlowInfoSend = 33 // IPV6_FLOWINFO_SEND: sin6_flowinfo of sendto is used
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
		require.NotZero(t, r.next(t)&wire.FlowLabelMask, "a plain socket's datagram (auto_flowlabels=1) is labelled")
	}

	c := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo6}})
	for _, class := range []uint8{0, 0x68} {
		require.NoError(t, c.Send([][]byte{payload(int(class), 100)}, Endpoint{Remote: to, TrafficClass: class}))
		info := r.next(t)
		require.Equal(t, uint32(0), info&wire.FlowLabelMask, "flow label (class %#x; flow info %#08x)", class, info)
		require.Equal(t, uint32(class), info>>20, "traffic class")
	}
}

// labelledSender is a plain IPv6 UDP socket on ::1 that sends with flow
// label label (IPV6_FLOWLABEL_MGR leases it, IPV6_FLOWINFO_SEND has
// sendto use it), or an error when the kernel refuses the lease (an
// unprivileged process: EPERM on Linux 6.x here).
func labelledSender(t *testing.T, label uint32) (func(to netip.AddrPort, b []byte), error) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	// struct in6_flowlabel_req: flr_dst, flr_label (big-endian),
	// flr_action, flr_share, flr_flags, flr_expires, flr_linger, pad.
	var req [32]byte
	dst := lo6.As16()
	copy(req[0:16], dst[:])
	binary.BigEndian.PutUint32(req[16:20], label)
	req[20] = 0                                  // IPV6_FL_A_GET
	req[21] = 1                                  // IPV6_FL_S_EXCL
	binary.NativeEndian.PutUint16(req[22:24], 1) // IPV6_FL_F_CREATE
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.IPPROTO_IPV6, ipv6FlowLabelMgr,
		uintptr(unsafe.Pointer(&req[0])), uintptr(len(req)), 0)
	if e != 0 {
		return nil, e
	}
	require.NoError(t, unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, ipv6FlowInfoSend, 1))
	return func(to netip.AddrPort, b []byte) {
		t.Helper()
		// sin6_flowinfo is network order in the sockaddr; x/sys copies
		// the field as is, so it takes the label's big-endian bytes.
		var be [4]byte
		binary.BigEndian.PutUint32(be[:], label)
		sa := &unix.RawSockaddrInet6{Family: unix.AF_INET6, Flowinfo: binary.NativeEndian.Uint32(be[:]), Addr: to.Addr().As16()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], to.Port())
		_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0,
			uintptr(unsafe.Pointer(sa)), unsafe.Sizeof(*sa))
		require.Zero(t, e, "sendto with flow label %#x", label)
	}, nil
}

// TestReportFlowLabel: over IPv6 a reporting Conn (ReportTraffic, as
// while a UD QP exists) gives a datagram's flow label in
// Endpoint.FlowLabel, for a UD GRH, and 0 when not reporting. The label
// is a crafted one where the kernel lets this process lease it, else the
// one Linux hashes for a plain socket (auto_flowlabels), which is not 0.
// Bug (IPv6 traffic parity, item 2, session O): the label was never
// reported, and rxe's GRH holds it (build_rdma_network_hdr copies the
// IPv6 header).
func TestReportFlowLabel(t *testing.T) {
	if !hasIPv6Loopback() {
		t.Skip("no IPv6 loopback")
	}
	c := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo6}})
	to := c.LocalAddrs()[0]
	const crafted = 0xABCDE
	send, err := labelledSender(t, crafted)
	want := uint32(crafted)
	if err != nil {
		if !errors.Is(err, unix.EPERM) {
			require.NoError(t, err)
		}
		if autoFlowLabels() != "1" && autoFlowLabels() != "3" {
			if os.Getenv("CI") == "true" {
				t.Fatalf("no way to send a flow label: IPV6_FLOWLABEL_MGR refused (%v), auto_flowlabels=%q", err, autoFlowLabels())
			}
			t.Skipf("no way to send a flow label: IPV6_FLOWLABEL_MGR refused (%v), auto_flowlabels=%q", err, autoFlowLabels())
		}
		t.Logf("IPV6_FLOWLABEL_MGR refused (%v): a plain socket's automatic label instead", err)
		plain, derr := net.DialUDP("udp6", nil, net.UDPAddrFromAddrPort(to))
		require.NoError(t, derr)
		t.Cleanup(func() { plain.Close() })
		send = func(_ netip.AddrPort, b []byte) {
			_, err := plain.Write(b)
			require.NoError(t, err)
		}
		want = 0 // any but 0: the kernel's hash
	}
	recv := func() uint32 {
		t.Helper()
		send(to, []byte{1, 2, 3})
		return receiveN(t, c, 1, 64)[0].ep.FlowLabel
	}
	require.Zero(t, recv(), "not reporting")
	r := c.(TrafficReporter)
	require.NoError(t, r.ReportTraffic(true))
	got := recv()
	if want != 0 {
		require.Equal(t, want, got, "the crafted label")
	} else {
		require.NotZero(t, got, "the kernel's automatic label")
		require.Equal(t, got, recv(), "one flow, one label")
	}
	require.NoError(t, r.ReportTraffic(false))
	require.Zero(t, recv(), "off again")
}
