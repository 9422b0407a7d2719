//go:build !linux

package conform

import "time"

func setSockOpts(fd int, ipv4 bool) error { return nil }

// rxOOBLen: no control messages are read off Linux.
var rxOOBLen = 0

// arrivalLag: no arrival stamps off Linux, so a packet is timed when it
// is read.
func arrivalLag([]byte, time.Time) (time.Duration, bool) { return 0, false }
