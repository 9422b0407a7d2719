package rdmacm

import (
	"net/netip"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// MemDevice opens a device with one worker on net at addr, closed at the
// end of the test: for the package's own tests and its external ones.
func MemDevice(t *testing.T, net *transport.MemNetwork, addr string) *ib.Device {
	t.Helper()
	c, err := net.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), transport.RoCEv2Port))
	require.NoError(t, err)
	dev, err := ib.OpenDevice(ib.Config{Conn: c, Workers: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dev.Close() })
	return dev
}

// Rounds is how many rounds a race test runs: full, or short with -short.
func Rounds(full, short int) int {
	if testing.Short() {
		return short
	}
	return full
}
