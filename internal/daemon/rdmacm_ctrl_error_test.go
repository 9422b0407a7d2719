package daemon

import (
	"net/netip"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// TestNewCMControlFailsCleanly: NewCMControl on a device that cannot make
// its CQ returns the error. Bug (found by an audit of error paths,
// session AE): its deferred cleanup called Close on the named result,
// which every failing return had just set to nil, so it panicked instead
// of releasing what it had made; in a daemon session that panic would
// end the daemon.
func TestNewCMControlFailsCleanly(t *testing.T) {
	c, err := transport.NewMemNetwork().Listen(netip.MustParseAddrPort("10.0.0.1:4791"))
	require.NoError(t, err)
	dev, err := ib.OpenDevice(ib.Config{Conn: c, Workers: 1})
	require.NoError(t, err)
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	require.NoError(t, dev.Close()) // every create fails now
	var ctrl *CMControl
	require.NotPanics(t, func() { ctrl, err = NewCMControl(dev, pd, CMControlConfig{}) })
	require.ErrorIs(t, err, ib.ErrDeviceClosed)
	require.Nil(t, ctrl)
}
