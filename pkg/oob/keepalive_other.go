//go:build !linux

package oob

import (
	"net"
	"time"
)

// setUserTimeout does nothing where TCP_USER_TIMEOUT is not available:
// the keepalive alone bounds an idle wait.
func setUserTimeout(*net.TCPConn, time.Duration) error { return nil }
