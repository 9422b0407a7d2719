//go:build !linux

package transport

import (
	"fmt"
	"net/netip"
)

// JoinGroup implements GroupJoiner outside Linux: not supported (the
// portable fallback has no membership calls); MemNetwork groups work
// everywhere.
func (c *udpConn) JoinGroup(group netip.Addr) (*Membership, error) {
	return nil, fmt.Errorf("%w (UDP multicast needs Linux): %v", ErrNoMulticast, group)
}
