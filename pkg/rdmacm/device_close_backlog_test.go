package rdmacm_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// TestDeviceCloseDrainsListenerBacklogs: a device that closes under
// listeners left open refuses what their backlogs hold as Listener.Close
// does (REJ 28, SIDR_REP REJECT), not counted req_expired, and stops
// their expiry timers: nothing is left on the CM's clock, a later
// deadline refuses and counts nothing, and Accept says
// ib.ErrDeviceClosed instead of handing out a request of a closed CM.
//
// Bug (rdmacm device close task, item 2): the backlogs' timers outlived
// the device (up to maxQueuedREQ, 2 minutes, on the system clock) and,
// firing, refused requests against the closed CM and counted them
// req_expired; Accept returned a queued request; a queued SIDR_REQ got
// no answer at all.
func TestDeviceCloseDrainsListenerBacklogs(t *testing.T) {
	hs, fc := expiryHosts(t, "10.12.11.1", "10.12.11.2")
	srv, cli := hs[0], hs[1]
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.12.11.1:7491"), nil)
	require.NoError(t, err)
	defer l.Close()
	u, err := rdmacm.Listen(srv.dev, ap("10.12.11.1:7492"), &rdmacm.ListenOptions{PortSpace: mad.PortSpaceUDP})
	require.NoError(t, err)
	defer u.Close()

	results, _ := flooder(t, cli, l.Addr(), 1)
	udErr := make(chan error, 1)
	go func() {
		_, err := rdmacm.DialUD(ctx, cli.dev, u.Addr(), nil) // its clock stands still: one SIDR_REQ
		udErr <- err
	}()
	require.Eventually(t, func() bool { return rdmacm.Queued(l) == 1 && rdmacm.Queued(u) == 1 },
		20*time.Second, time.Millisecond)

	require.NoError(t, srv.dev.Close())
	require.Zero(t, fc.Pending(), "no timer left on the closed device's CM clock")
	require.Zero(t, rdmacm.Queued(l))
	require.Zero(t, rdmacm.Queued(u))
	for _, ln := range []*rdmacm.Listener{l, u} {
		done, cancel := context.WithCancel(ctx)
		cancel()
		req, err := ln.Accept(done)
		require.ErrorIs(t, err, ib.ErrDeviceClosed)
		require.Nil(t, req)
	}

	var rej *rdmacm.RejectError
	require.ErrorAs(t, <-results, &rej, "the queued REQ is refused")
	require.Equal(t, mad.REJConsumerDefined, rej.Reason)
	var se *rdmacm.SIDRError
	require.ErrorAs(t, <-udErr, &se, "the queued SIDR_REQ is refused")
	require.Equal(t, mad.SIDRReject, se.Status)

	fc.Advance(3 * time.Minute)
	require.Zero(t, rdmacm.ExpiredCount(l), "nothing counted req_expired")
}

// TestAcceptAfterListenerAndDeviceClosedSaysErrClosed: once both the
// listener and its device are closed, every Accept says ErrClosed, the
// application's own close, and a blocked one wakes to the same. Bug
// (review of session AK's device-close change): Accept selected on both
// closings at once and returned ErrClosed or ib.ErrDeviceClosed at
// random.
func TestAcceptAfterListenerAndDeviceClosedSaysErrClosed(t *testing.T) {
	hs, _ := expiryHosts(t, "10.12.11.3", "10.12.11.4")
	srv := hs[0]
	ctx := testCtx(t)
	l, err := rdmacm.Listen(srv.dev, ap("10.12.11.3:7493"), nil)
	require.NoError(t, err)
	blocked := make(chan error, 1)
	go func() {
		_, err := l.Accept(ctx)
		blocked <- err
	}()
	require.NoError(t, srv.dev.Close())
	require.NoError(t, l.Close())
	err = <-blocked
	require.True(t, errors.Is(err, rdmacm.ErrClosed) || errors.Is(err, ib.ErrDeviceClosed), "%v", err)
	for i := range 200 {
		_, err := l.Accept(ctx)
		require.ErrorIs(t, err, rdmacm.ErrClosed, "Accept %d", i)
	}
}
