//go:build linux

package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// skipWithoutRaw skips a test that needs CAP_NET_RAW, except in CI where the
// capability is expected and its absence is a failure.
func skipWithoutRaw(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("raw socket needs CAP_NET_RAW (CI=true): %v", err)
		}
		t.Skipf("raw socket needs CAP_NET_RAW/root: %v", err)
	}
	require.NoError(t, err)
}

// loCapture is an AF_PACKET socket on the loopback device: it sees every
// frame the kernel really puts on lo, with a 14-byte (all-zero) Ethernet
// header.
type loCapture struct{ fd int }

func openLoCapture(t *testing.T, dstPort uint16) *loCapture {
	t.Helper()
	// Protocol 0 receives nothing until bound: attach the filter first so
	// that other tests' loopback traffic never fills this socket's queue.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	skipWithoutRaw(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	require.NoError(t, unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, udpDstPortFilter(dstPort)))
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
	lo, err := net.InterfaceByName("lo")
	require.NoError(t, err)
	require.NoError(t, unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: lo.Index}))
	require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 10}))
	return &loCapture{fd: fd}
}

// udpDstPortFilter is a classic BPF program accepting Ethernet frames with
// IPv4 (no options) or IPv6 (no extension headers) UDP to port.
func udpDstPortFilter(port uint16) *unix.SockFprog {
	const (
		ldh  = unix.BPF_LD | unix.BPF_H | unix.BPF_ABS
		ldb  = unix.BPF_LD | unix.BPF_B | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		retk = unix.BPF_RET | unix.BPF_K
	)
	prog := []unix.SockFilter{
		{Code: ldh, K: 12},                         // 0: ethertype
		{Code: jeq, K: 0x0800, Jt: 0, Jf: 4},       // 1: IPv4? else 6
		{Code: ldb, K: 14 + 9},                     // 2: protocol
		{Code: jeq, K: 17, Jt: 0, Jf: 8},           // 3: UDP? else drop (12)
		{Code: ldh, K: 14 + 20 + 2},                // 4: destination port
		{Code: jeq, K: uint32(port), Jt: 5, Jf: 6}, // 5: accept (11) or drop (12)
		{Code: jeq, K: 0x86dd, Jt: 0, Jf: 5},       // 6: IPv6? else drop (12)
		{Code: ldb, K: 14 + 6},                     // 7: next header
		{Code: jeq, K: 17, Jt: 0, Jf: 3},           // 8: UDP? else drop (12)
		{Code: ldh, K: 14 + 40 + 2},                // 9: destination port
		{Code: jeq, K: uint32(port), Jt: 0, Jf: 1}, // 10: accept or drop
		{Code: retk, K: 0xffff},                    // 11: accept
		{Code: retk, K: 0},                         // 12: drop
	}
	return &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// next returns the first captured frame whose UDP payload is payload. lo
// shows each packet once per direction (outgoing and incoming); both copies
// are identical.
func (c *loCapture) next(t *testing.T, payload []byte) []byte {
	t.Helper()
	buf := make([]byte, 1<<16)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		n, _, err := unix.Recvfrom(c.fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		require.NoError(t, err)
		f := buf[:n]
		if n > 14 && bytes.HasSuffix(f, payload) {
			return append([]byte(nil), f...)
		}
	}
	t.Fatal("frame not captured")
	return nil
}

// TestKernelSendsPredictableIPv4Header verifies the claim the ICRC rests on:
// from our unconnected IP_PMTUDISC_DO socket, Linux sends ID 0, DF, TTL 64,
// TOS 0, and the header equals what buildIPv4Header (used by the pcap
// recorder) reconstructs.
func TestKernelSendsPredictableIPv4Header(t *testing.T) {
	a := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo1}})
	b := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo2}})
	capt := openLoCapture(t, b.LocalAddrs()[0].Port())
	for i, size := range []int{16, 1000, 4136} {
		p := payload(0x5a5a0000+i, size)
		// One datagram per Send: a GSO message is one frame on lo.
		require.NoError(t, a.Send([][]byte{p}, Endpoint{Remote: b.LocalAddrs()[0]}))
		receiveN(t, b, 1, MaxDatagramSize)
		f := capt.next(t, p)
		ip := f[14:]
		require.Equal(t, byte(0x45), ip[0], "version/IHL")
		require.Equal(t, byte(0), ip[1], "TOS")
		require.Equal(t, uint16(20+8+size), binary.BigEndian.Uint16(ip[2:4]))
		require.Equal(t, uint16(0), binary.BigEndian.Uint16(ip[4:6]), "IPv4 ID")
		require.Equal(t, uint16(0x4000), binary.BigEndian.Uint16(ip[6:8]), "flags DF, no fragment offset")
		require.Equal(t, byte(64), ip[8], "TTL")
		require.Equal(t, byte(unix.IPPROTO_UDP), ip[9])
		require.Equal(t, lo1.AsSlice(), ip[12:16])
		require.Equal(t, lo2.AsSlice(), ip[16:20])
		var want [20]byte
		wire.Flow{Src: netip.AddrPortFrom(lo1, 0), Dst: netip.AddrPortFrom(lo2, 0)}.PutIPHeader(want[:], 8+size)
		require.Equal(t, want[:], ip[:20], "reconstructed header (incl. checksum) equals the kernel's")
		udp := ip[20:28]
		require.Equal(t, a.LocalAddrs()[0].Port(), binary.BigEndian.Uint16(udp[0:2]))
		require.Equal(t, b.LocalAddrs()[0].Port(), binary.BigEndian.Uint16(udp[2:4]))
		require.Equal(t, uint16(8+size), binary.BigEndian.Uint16(udp[4:6]))
	}
}

// TestKernelSendsPredictableIPv6Header checks the IPv6 fields the ICRC does
// not mask are what the recorder reconstructs, and the flow label, which
// it masks, is rxe's 0, not a hash Linux derives from the flow
// (TestKernelSendsFlowLabelZero).
func TestKernelSendsPredictableIPv6Header(t *testing.T) {
	if !hasIPv6Loopback() {
		t.Skip("no IPv6 loopback")
	}
	a := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo6}})
	b := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo6}})
	capt := openLoCapture(t, b.LocalAddrs()[0].Port())
	p := payload(0x6b6b0000, 300)
	require.NoError(t, a.Send([][]byte{p}, Endpoint{Remote: b.LocalAddrs()[0]}))
	receiveN(t, b, 1, MaxDatagramSize)
	ip := capt.next(t, p)[14:]
	var want [40]byte
	wire.Flow{Src: netip.AddrPortFrom(lo6, 0), Dst: netip.AddrPortFrom(lo6, 0)}.PutIPHeader(want[:], 8+len(p))
	require.Equal(t, byte(0x60), ip[0]&0xf0, "version")
	require.Equal(t, byte(0), (ip[0]&0x0f)<<4|ip[1]>>4, "traffic class")
	if autoFlowLabels() != "3" { // 3 forces a label whatever the socket says
		require.Equal(t, []byte{0, 0, 0}, []byte{ip[1] & 0x0f, ip[2], ip[3]}, "flow label")
	}
	require.Equal(t, want[4:8], ip[4:8], "payload length, next header, hop limit 64")
	require.Equal(t, want[8:40], ip[8:40], "addresses")
}

// TestIPv6ZeroChecksumAccepted sends what rdma_rxe sends over IPv6, a UDP
// datagram with checksum 0, from a raw socket. Our socket must accept it
// (UDP_NO_CHECK6_RX); a plain socket drops it, which the control half shows
// without waiting for a timeout: it receives the valid datagram sent after
// the zero-checksum one as its first.
func TestIPv6ZeroChecksumAccepted(t *testing.T) {
	if !hasIPv6Loopback() {
		t.Skip("no IPv6 loopback")
	}
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	skipWithoutRaw(t, err)
	defer unix.Close(fd)
	rawSend := func(dst netip.AddrPort, data []byte) {
		pkt := make([]byte, 8+len(data))
		binary.BigEndian.PutUint16(pkt[0:2], 4791)
		binary.BigEndian.PutUint16(pkt[2:4], dst.Port())
		binary.BigEndian.PutUint16(pkt[4:6], uint16(len(pkt)))
		// pkt[6:8] stays 0: no checksum. Raw IPv6 sockets leave it alone
		// unless IPV6_CHECKSUM is set.
		copy(pkt[8:], data)
		require.NoError(t, unix.Sendto(fd, pkt, 0, &unix.SockaddrInet6{Addr: dst.Addr().As16()}))
	}

	c := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{lo6}})
	rawSend(c.LocalAddrs()[0], []byte("zero checksum"))
	got := receiveN(t, c, 1, 64)
	require.Equal(t, []byte("zero checksum"), got[0].data)
	require.Equal(t, netip.AddrPortFrom(lo6, 4791), got[0].ep.Remote)

	plain, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	require.NoError(t, err)
	defer plain.Close()
	dst := plain.LocalAddr().(*net.UDPAddr).AddrPort()
	rawSend(dst, []byte("dropped"))
	var sendErr error
	require.NoError(t, c.(*udpConn).socks[0].sys.rc.Control(func(fd uintptr) {
		sendErr = unix.Sendto(int(fd), []byte("valid"), 0, &unix.SockaddrInet6{Port: int(dst.Port()), Addr: dst.Addr().As16()})
	}))
	require.NoError(t, sendErr)
	buf := make([]byte, 64)
	require.NoError(t, plain.SetReadDeadline(time.Now().Add(10*time.Second)))
	n, _, err := plain.ReadFromUDPAddrPort(buf)
	require.NoError(t, err)
	require.Equal(t, "valid", string(buf[:n]), "a plain IPv6 socket must drop checksum 0")
}
