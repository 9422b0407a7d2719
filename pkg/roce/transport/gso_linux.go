//go:build linux

package transport

import (
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
