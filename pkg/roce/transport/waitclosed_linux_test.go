package transport

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWaitClosedWaitsForAUseInFlight: a socket whose descriptor is in use
// by another goroutine (a poller's receive: Control) when Close runs stays
// bound until that use ends; WaitClosed returns then, and not before, and
// the address can be bound again once it has. Engine.Close relies on it
// (TestEngineCloseWaitsForItsSockets).
func TestWaitClosedWaitsForAUseInFlight(t *testing.T) {
	c, err := OpenUDP(UDPConfig{Addrs: []netip.Addr{lo1}})
	require.NoError(t, err)
	u := c.(*udpConn)
	addr := c.LocalAddrs()[0]
	entered, release := make(chan struct{}), make(chan struct{})
	used := make(chan error, 1)
	go func() {
		used <- u.socks[0].sys.raw.Control(func(uintptr) { close(entered); <-release })
	}()
	<-entered
	require.NoError(t, c.Close())

	_, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
	require.True(t, errors.Is(err, syscall.EADDRINUSE), "bound while a use was in flight: %v", err)
	waited := make(chan struct{})
	go func() { u.WaitClosed(); close(waited) }()
	select {
	case <-waited:
		t.Fatal("WaitClosed returned while the descriptor was in use")
	default:
	}

	close(release)
	require.NoError(t, <-used)
	<-waited
	pc, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
	require.NoError(t, err, "the address is still bound after WaitClosed")
	require.NoError(t, pc.Close())

	// With nothing in flight, Close closes at once.
	c2, err := OpenUDP(UDPConfig{Addrs: []netip.Addr{lo1}})
	require.NoError(t, err)
	require.NoError(t, c2.Close())
	c2.(CloseWaiter).WaitClosed()
}
