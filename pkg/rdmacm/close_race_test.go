package rdmacm_test

import (
	"errors"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// hangBound is how long a call that must not block may take before the
// test calls it a hang: these calls take microseconds.
const hangBound = 30 * time.Second

// returnsWithin runs f and fails the test if it has not returned within
// hangBound.
func returnsWithin(t *testing.T, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(hangBound):
		buf := make([]byte, 1<<20)
		t.Fatalf("%s hung:\n%s", what, buf[:runtime.Stack(buf, true)])
		return nil
	}
}

// TestAcquireWhileTheDeviceCloses: the first rdmacm use of a device whose
// close hooks have started fails with ib.ErrDeviceClosed, and the
// process's other devices keep working. Bug (found by a lock-order audit,
// session AE): acquire held the registry's lock across ib.Device.OnClose,
// which on a closing device runs the new agent's close at once, and that
// takes the same lock: the goroutine blocked for good, and with it every
// later Enable, Listen, Dial and Counters of the process (the daemon's
// metrics too).
func TestAcquireWhileTheDeviceCloses(t *testing.T) {
	net := transport.NewMemNetwork()
	dev, other := rdmacm.MemDevice(t, net, "10.0.0.1"), rdmacm.MemDevice(t, net, "10.0.0.2")
	inHook, hold := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release)                            // before the devices' Close, even when the test fails
	dev.OnClose(func() { close(inHook); <-hold }) // a service's slow teardown
	closed := make(chan error, 1)
	go func() { closed <- dev.Close() }()
	<-inHook // the hooks run: the device still works, its hooks have fired

	err := returnsWithin(t, "Enable on a closing device", func() error { return rdmacm.Enable(dev, nil) })
	require.ErrorIs(t, err, ib.ErrDeviceClosed)
	err = returnsWithin(t, "Listen on a closing device", func() error {
		l, err := rdmacm.Listen(dev, netip.MustParseAddrPort("10.0.0.1:7471"), nil)
		if err == nil {
			l.Close()
		}
		return err
	})
	require.ErrorIs(t, err, ib.ErrDeviceClosed)
	require.NoError(t, returnsWithin(t, "Enable on another device", func() error { return rdmacm.Enable(other, nil) }))

	release()
	require.NoError(t, <-closed)
}

// TestAcquireRacingClose: Enable racing Close, at every offset a few
// hundred scheduler turns can make, returns, with nil or
// ib.ErrDeviceClosed. Before the fix it hung within a few hundred rounds
// (TestAcquireWhileTheDeviceCloses says why).
func TestAcquireRacingClose(t *testing.T) {
	net := transport.NewMemNetwork()
	for i := range rdmacm.Rounds(600, 100) {
		dev := rdmacm.MemDevice(t, net, "10.0.1.1")
		enabled := make(chan error, 1)
		go func() { enabled <- rdmacm.Enable(dev, nil) }()
		for range i % 200 {
			runtime.Gosched()
		}
		require.NoError(t, returnsWithin(t, "Close racing Enable", dev.Close))
		err := returnsWithin(t, "Enable racing Close", func() error { return <-enabled })
		if err != nil && !errors.Is(err, ib.ErrDeviceClosed) {
			t.Fatalf("round %d: Enable racing Close: %v", i, err)
		}
	}
}
