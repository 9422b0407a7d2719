package conform

import "golang.org/x/sys/unix"

// setSockOpts makes the socket send what wire.Flow.Seal assumes: IPv4 DF
// with ID 0 (IP_PMTUDISC_DO on an unconnected socket), so a kernel peer
// that checks the ICRC against the real header accepts our packets.
func setSockOpts(fd int, ipv4 bool) error {
	if ipv4 {
		return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	}
	return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
}
