package ib_test

import (
	"testing"

	"github.com/rxed/rxed/pkg/roce/transport"
)

// peerPair opens two peers at addrA and addrB on a network of their own,
// closed when the test ends.
func peerPair(t *testing.T, addrA, addrB string) (a, b *peer) {
	t.Helper()
	net := transport.NewMemNetwork()
	a, b = openPeer(net, addrA), openPeer(net, addrB)
	t.Cleanup(func() { a.close(); b.close() })
	return a, b
}
