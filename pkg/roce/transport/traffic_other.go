//go:build !linux

package transport

// recvTraffic: the portable path sees no IP header; received datagrams
// report TOS and TTL 0.
func (s *udpSocket) recvTraffic(bool) error { return nil }
