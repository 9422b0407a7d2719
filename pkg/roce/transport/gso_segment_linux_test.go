//go:build linux

package transport

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

const inNetnsEnv = "RXED_TRANSPORT_IN_NETNS"

// TestGSOSegmentIPv4IDs checks, on a real (software) segmentation path, why
// OpenUDP uses IPv4 GSO only towards loopback: Linux numbers the IPv4 IDs of
// a GSO message's segments 0, 1, 2, … while the ICRC of each datagram covers
// ID 0. It re-runs itself inside a network namespace it creates, with a tap
// device without offloads (so the kernel segments before the device) and
// reads the frames the kernel puts on the wire from the tap.
func TestGSOSegmentIPv4IDs(t *testing.T) {
	if os.Getenv(inNetnsEnv) == "1" {
		gsoInNetns(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("needs /dev/net/tun")
	}
	ns := fmt.Sprintf("rxed-transport-test-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("cannot create a network namespace: %v %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run", "^TestGSOSegmentIPv4IDs$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), inNetnsEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child in netns:\n%s", out)
	require.Contains(t, string(out), "checked in netns", "child did not run its checks:\n%s", out)
}

type tapDev struct{ fd int }

func openTap(t *testing.T, name string) *tapDev {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	var ifr [unix.IFNAMSIZ + 24]byte
	copy(ifr[:], name)
	binary.NativeEndian.PutUint16(ifr[unix.IFNAMSIZ:], unix.IFF_TAP|unix.IFF_NO_PI)
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&ifr[0])))
	require.Zero(t, e, "TUNSETIFF")
	t.Cleanup(func() { unix.Close(fd) })
	return &tapDev{fd: fd}
}

// udpFrames reads frames from the tap until n UDP datagrams to port 4791
// arrived, returning their IP headers + UDP (everything after Ethernet).
func (d *tapDev) udpFrames(t *testing.T, n int) [][]byte {
	buf := make([]byte, 1<<16)
	var out [][]byte
	for len(out) < n {
		pfd := []unix.PollFd{{Fd: int32(d.fd), Events: unix.POLLIN}}
		k, err := unix.Poll(pfd, 10000)
		if err == unix.EINTR {
			continue
		}
		require.NoError(t, err)
		require.Positive(t, k, "timed out waiting for frames")
		m, err := unix.Read(d.fd, buf)
		require.NoError(t, err)
		f := buf[:m]
		if m < 14 {
			continue
		}
		ip := f[14:]
		switch binary.BigEndian.Uint16(f[12:]) {
		case 0x0800:
			if len(ip) >= 28 && ip[9] == 17 && binary.BigEndian.Uint16(ip[22:]) == 4791 {
				out = append(out, append([]byte(nil), ip...))
			}
		case 0x86dd:
			if len(ip) >= 48 && ip[6] == 17 && binary.BigEndian.Uint16(ip[42:]) == 4791 {
				out = append(out, append([]byte(nil), ip...))
			}
		}
	}
	return out
}

func ipCmd(t *testing.T, args ...string) {
	out, err := exec.Command("ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %v: %s", args, out)
}

func gsoInNetns(t *testing.T) {
	tap := openTap(t, "rxgso0")
	ipCmd(t, "link", "set", "rxgso0", "up")
	ipCmd(t, "addr", "add", "198.18.0.1/24", "dev", "rxgso0")
	ipCmd(t, "neigh", "add", "198.18.0.2", "lladdr", "02:00:00:00:00:02", "dev", "rxgso0")
	ipCmd(t, "-6", "addr", "add", "fd00:4791::1/64", "dev", "rxgso0", "nodad")
	ipCmd(t, "-6", "neigh", "add", "fd00:4791::2", "lladdr", "02:00:00:00:00:02", "dev", "rxgso0")

	bufs := make([][]byte, 4)
	for i := range bufs {
		bufs[i] = payload(i, 1000)
	}

	// Our Conn to a non-loopback IPv4 peer: no GSO, so every datagram goes
	// out with ID 0, as its ICRC assumes.
	c := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr("198.18.0.1")}})
	require.NoError(t, c.Send(bufs, Endpoint{Remote: ap("198.18.0.2:4791")}))
	for i, ip := range tap.udpFrames(t, len(bufs)) {
		require.Equal(t, uint16(0), binary.BigEndian.Uint16(ip[4:]), "datagram %d IPv4 ID", i)
		require.Equal(t, uint16(0x4000), binary.BigEndian.Uint16(ip[6:]), "DF")
		require.Equal(t, bufs[i], ip[28:])
	}
	require.Zero(t, c.(StatsReporter).Stats().GSOSends)

	gso, _ := probeOffloads()
	if gso {
		// The reason: a raw UDP_SEGMENT send from the same kind of socket
		// gets IDs 0, 1, 2, 3.
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		require.NoError(t, err)
		defer unix.Close(fd)
		require.NoError(t, unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO))
		require.NoError(t, unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{198, 18, 0, 1}}))
		oob := make([]byte, unix.CmsgSpace(2))
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
		h.SetLen(unix.CmsgLen(2))
		binary.NativeEndian.PutUint16(oob[unix.CmsgLen(0):], 1000)
		require.NoError(t, unix.Sendmsg(fd, make([]byte, 4000), oob, &unix.SockaddrInet4{Addr: [4]byte{198, 18, 0, 2}, Port: 4791}, 0))
		for i, ip := range tap.udpFrames(t, 4) {
			require.Equal(t, uint16(i), binary.BigEndian.Uint16(ip[4:]), "GSO segment %d IPv4 ID", i)
		}

		// IPv6 has no ID: our Conn uses GSO and the segments' headers are
		// what the ICRC expects.
		c6 := openTestUDP(t, UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr("fd00:4791::1")}})
		require.NoError(t, c6.Send(bufs, Endpoint{Remote: ap("[fd00:4791::2]:4791")}))
		for i, ip := range tap.udpFrames(t, len(bufs)) {
			require.Equal(t, uint16(1008), binary.BigEndian.Uint16(ip[4:]), "payload length")
			require.Equal(t, byte(64), ip[7], "hop limit")
			require.Equal(t, bufs[i], ip[48:])
		}
		require.Equal(t, uint64(1), c6.(StatsReporter).Stats().GSOSends)
	}
	t.Log("checked in netns")
}
