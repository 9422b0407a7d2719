//go:build linux

package transport

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// nlMsg lays out a netlink message with x/sys's structs: the header
// (length filled in), then body.
func nlMsg(typ, flags uint16, seq uint32, body ...[]byte) []byte {
	var n []byte
	for _, b := range body {
		n = append(n, b...)
	}
	h := unix.NlMsghdr{Len: uint32(unix.SizeofNlMsghdr + len(n)), Type: typ, Flags: flags, Seq: seq}
	out := append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&h)), unix.SizeofNlMsghdr)...)
	return append(out, n...)
}

func ifaddrmsg(family uint8, index uint32) []byte {
	m := unix.IfAddrmsg{Family: family, Index: index}
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&m)), unix.SizeofIfAddrmsg)...)
}

func rtattr(typ uint16, data []byte) []byte {
	a := unix.RtAttr{Len: uint16(unix.SizeofRtAttr + len(data)), Type: typ}
	out := append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&a)), unix.SizeofRtAttr)...)
	out = append(out, data...)
	for len(out)%unix.RTA_ALIGNTO != 0 {
		out = append(out, 0)
	}
	return out
}

// TestGetAddrRequest encodes the RTM_GETADDR request for one IPv6
// address as x/sys's netlink structs lay it out.
func TestGetAddrRequest(t *testing.T) {
	for _, a := range []string{"fe80::b", "::1", "2001:db8::1:2"} {
		addr := netip.MustParseAddr(a)
		a16 := addr.As16()
		want := nlMsg(unix.RTM_GETADDR, unix.NLM_F_REQUEST, 42, ifaddrmsg(unix.AF_INET6, 0), rtattr(unix.IFA_ADDRESS, a16[:]))
		b := make([]byte, 128)
		for i := range b {
			b[i] = 0xEE // stale bytes must not leak in
		}
		n := putGetAddrRequest(b, 42, addr)
		require.Equal(t, want, b[:n], a)
	}
}

// TestGetAddrReply reads the kernel's answers: the interface index of
// an RTM_NEWADDR (attributes after it ignored), the errno of an
// NLMSG_ERROR, a message of another request as stale, and malformed
// ones as errors, never reading past the buffer.
func TestGetAddrReply(t *testing.T) {
	a16 := netip.MustParseAddr("fe80::b").As16()
	nlerr := func(errno int32) []byte {
		b := binary.NativeEndian.AppendUint32(nil, uint32(-errno))
		return append(b, make([]byte, unix.SizeofNlMsghdr)...) // the request's header
	}
	newAddr := nlMsg(unix.RTM_NEWADDR, 0, 7, ifaddrmsg(unix.AF_INET6, 5), rtattr(unix.IFA_ADDRESS, a16[:]),
		rtattr(unix.IFA_FLAGS, make([]byte, 4)))
	for _, tc := range []struct {
		name    string
		b       []byte
		want    uint32
		wantErr error // nil: any error; with ok, none
		ok      bool
	}{
		{name: "RTM_NEWADDR", b: newAddr, want: 5, ok: true},
		{name: "RTM_NEWADDR with more after it", b: append(append([]byte(nil), newAddr...), 1, 2, 3), want: 5, ok: true},
		{name: "no such address", b: nlMsg(unix.NLMSG_ERROR, 0, 7, nlerr(int32(unix.EADDRNOTAVAIL))), wantErr: unix.EADDRNOTAVAIL},
		{name: "an acknowledgement", b: nlMsg(unix.NLMSG_ERROR, 0, 7, nlerr(0))},
		{name: "another request's", b: nlMsg(unix.RTM_NEWADDR, 0, 6, ifaddrmsg(unix.AF_INET6, 5)), wantErr: errStaleReply},
		{name: "IPv4 address", b: nlMsg(unix.RTM_NEWADDR, 0, 7, ifaddrmsg(unix.AF_INET, 5))},
		{name: "short body", b: nlMsg(unix.RTM_NEWADDR, 0, 7, []byte{unix.AF_INET6, 0, 0})},
		{name: "short error", b: nlMsg(unix.NLMSG_ERROR, 0, 7, []byte{1, 2})},
		{name: "other type", b: nlMsg(unix.RTM_NEWLINK, 0, 7, ifaddrmsg(unix.AF_INET6, 5))},
		{name: "short header", b: newAddr[:unix.SizeofNlMsghdr-1]},
		{name: "length past the buffer", b: newAddr[:len(newAddr)-1]},
		{name: "length below the header", b: func() []byte {
			b := append([]byte(nil), newAddr...)
			binary.NativeEndian.PutUint32(b, unix.SizeofNlMsghdr-1)
			return b
		}()},
	} {
		got, err := parseGetAddrReply(tc.b, 7)
		if tc.ok {
			require.NoError(t, err, tc.name)
			require.Equal(t, tc.want, got, tc.name)
			continue
		}
		require.Error(t, err, tc.name)
		if tc.wantErr != nil {
			require.ErrorIs(t, err, tc.wantErr, tc.name)
		}
		require.Zero(t, got, tc.name)
	}
}

// TestScopeFinderAsksTheKernel: the kernel names the interface of a local
// address (::1 is on lo), none for an address no interface has, and the
// answer is cached until forgotten.
func TestScopeFinderAsksTheKernel(t *testing.T) {
	if !hasIPv6Loopback() {
		t.Skip("no IPv6 loopback")
	}
	lo, err := net.InterfaceByName("lo")
	require.NoError(t, err)
	f, err := newScopeFinder()
	require.NoError(t, err)
	defer f.close()
	require.Equal(t, uint32(lo.Index), f.index(netip.IPv6Loopback()))
	require.Equal(t, uint32(lo.Index), f.known[netip.IPv6Loopback()])
	require.Zero(t, f.index(netip.MustParseAddr("fe80::dead:beef:1:2")))
	_, err = f.ask(netip.MustParseAddr("fe80::dead:beef:1:2"))
	require.ErrorIs(t, err, unix.EADDRNOTAVAIL)
	f.forget(netip.IPv6Loopback())
	require.NotContains(t, f.known, netip.IPv6Loopback())
	f.close()
	require.Zero(t, f.index(netip.IPv6Loopback()), "closed")
}

// A sandbox that refuses netlink sockets (a seccomp profile, gVisor) must
// not make a socket bound to :: unusable: only its link-local sends lose
// their interface. Over ::1 it still carries datagrams both ways.
func TestWildcardSocketWithoutNetlinkStillServes(t *testing.T) {
	saved := openScopeFinder
	openScopeFinder = func() (*scopeFinder, error) { return nil, unix.EPERM }
	t.Cleanup(func() { openScopeFinder = saved })

	wc, err := OpenUDP(UDPConfig{Addrs: []netip.Addr{netip.IPv6Unspecified()}})
	require.NoError(t, err, "a refused netlink socket refused the UDP socket")
	t.Cleanup(func() { wc.Close() })
	lc, err := OpenUDP(UDPConfig{Addrs: []netip.Addr{netip.IPv6Loopback()}})
	require.NoError(t, err)
	t.Cleanup(func() { lc.Close() })

	to := netip.AddrPortFrom(netip.IPv6Loopback(), lc.LocalAddrs()[0].Port())
	from := netip.AddrPortFrom(netip.IPv6Loopback(), wc.LocalAddrs()[0].Port())
	require.NoError(t, wc.Send([][]byte{[]byte("ping")}, Endpoint{Local: from, Remote: to}))
	got := receiveN(t, lc, 1, 64)
	require.Equal(t, "ping", string(got[0].data))
	require.Equal(t, from, got[0].ep.Remote)
}
