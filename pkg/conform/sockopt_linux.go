package conform

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// setSockOpts makes the socket send what wire.Flow.Seal assumes: IPv4 DF
// with ID 0 (IP_PMTUDISC_DO on an unconnected socket), so a kernel peer
// that checks the ICRC against the real header accepts our packets; and
// has the kernel stamp each datagram's arrival (SO_TIMESTAMPNS: arrivalLag).
func setSockOpts(fd int, ipv4 bool) error {
	// Best effort: without stamps a packet is timed when it is read, as
	// before (arrivalLag finds none), which a sandbox that refuses the
	// option should not turn into a link that cannot open.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	if ipv4 {
		return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	}
	// Flow label 0, as rxe's prepare6 writes it: a UDP socket otherwise
	// labels its datagrams with a hash of the flow (net.ipv6.auto_flowlabels,
	// on by default), and a crafted packet should leave as rxe's would.
	// Best effort, as the engine's sockets do it (the ICRC masks the label).
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_AUTOFLOWLABEL, 0)
	return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
}

// rxOOBLen is the control buffer a receive needs for the arrival stamp.
var rxOOBLen = unix.CmsgSpace(int(unsafe.Sizeof(unix.Timespec{})))

// arrivalLag is how long before now the kernel stamped the datagram
// whose control messages are oob (SCM_TIMESTAMPNS, wall clock); false
// when they carry no stamp.
func arrivalLag(oob []byte, now time.Time) (time.Duration, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, false
	}
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_TIMESTAMPNS || len(m.Data) < int(unsafe.Sizeof(unix.Timespec{})) {
			continue
		}
		ts := *(*unix.Timespec)(unsafe.Pointer(&m.Data[0]))
		return max(0, now.Sub(time.Unix(ts.Unix()))), true
	}
	return 0, false
}
