//go:build linux

package transport

import (
	"net/netip"
	"sync"

	"golang.org/x/sys/unix"
)

// groSlotSize is the receive slot size when GRO may coalesce: the largest
// UDP payload of an IP packet.
const groSlotSize = 1 << 16

// Kernel limits for one UDP_SEGMENT send (UDP_MAX_SEGMENTS is 128 on older
// kernels; 64 stays within it and still makes 64 KiB messages for 1 KiB
// datagrams).
const (
	maxGSOSegments = 64
	maxGSOBytes4   = 0xFFFF - 20 - 8
	maxGSOBytes6   = 0xFFFF - 8
)

// offloads is what the running kernel supports, probed once per process.
var offloads struct {
	once     sync.Once
	gso, gro bool
}

func probeOffloads() (gso, gro bool) {
	offloads.once.Do(func() {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return
		}
		defer unix.Close(fd)
		_, err = unix.GetsockoptInt(fd, unix.SOL_UDP, unix.UDP_SEGMENT)
		offloads.gso = err == nil
		offloads.gro = unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1) == nil
	})
	return offloads.gso, offloads.gro
}

// maxGSOBytes is the most UDP payload one UDP_SEGMENT message may carry:
// an IP packet's payload less the UDP header (and, over IPv4, the IP
// header, which counts against the 16-bit total length).
func maxGSOBytes(is6 bool) int {
	if is6 {
		return maxGSOBytes6
	}
	return maxGSOBytes4
}

// gsoAllowed reports whether datagrams to dst may be sent as UDP GSO
// messages. IPv4 GSO only towards loopback: when the kernel (or a NIC)
// segments a UDP GSO message it numbers the IPv4 IDs of the segments 0,
// 1, 2, … (inet_gso_segment), but the ICRC of each datagram was computed
// for ID 0, so every datagram after the first would fail the peer's ICRC
// check. Loopback delivers the message unsegmented to the receiving
// socket, which never sees an ID. IPv6 has no ID: its segments' headers
// are identical.
func gsoAllowed(is6 bool, dst netip.Addr) bool {
	return is6 || dst.IsLoopback()
}

// gsoRun returns how many datagrams of src, from index first on, one
// UDP_SEGMENT message carries (1: the datagram goes alone). All of src
// goes to one destination (writeBatch's). The kernel cuts a GSO message
// into segments of the first datagram's size, so the run holds datagrams
// of that size, and one shorter datagram may end it; an empty datagram
// never joins one (nor starts one). room bounds the run by the iovecs
// left (in datagrams), maxGSOSegments and maxGSO (bytes, see
// maxGSOBytes) by the kernel's limits.
func gsoRun(src *txSource, first, room, maxGSO int) int {
	total := src.n()
	seg := src.len(first)
	cnt, size := 1, seg
	if seg == 0 {
		return 1
	}
	for first+cnt < total && cnt+1 <= room && cnt < maxGSOSegments {
		l := src.len(first + cnt)
		if l == 0 || l > seg || size+l > maxGSO {
			break
		}
		size += l
		cnt++
		if l < seg {
			break // a shorter datagram can only end a GSO run
		}
	}
	return cnt
}
