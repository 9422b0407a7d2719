package transport

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBindRetrying (on TEST-NET addresses: no test of the package closes
// a socket on them, and the binds are fakes): a bind refused with EADDRINUSE is tried again only
// for an address and port this process closed a socket on within
// rebindWindow; anything else is returned from the first attempt.
func TestBindRetrying(t *testing.T) {
	inUse := syscall.EADDRINUSE
	other := errors.New("some other failure")
	for _, tc := range []struct {
		name      string
		ap        string
		closedAgo time.Duration // < 0: never closed here
		results   []error       // what each bind attempt returns; the last repeats
		wantCalls int
		wantErr   error
	}{
		{"bound at once", "192.0.2.1:4791", 0, []error{nil}, 1, nil},
		{"in use, never closed here", "192.0.2.2:4791", -1, []error{inUse}, 1, inUse},
		{"in use, closed here just now", "192.0.2.3:4791", 0, []error{inUse, inUse, nil}, 3, nil},
		{"in use, closed here long ago", "192.0.2.4:4791", 2 * rebindWindow, []error{inUse}, 1, inUse},
		{"another error, closed here", "192.0.2.5:4791", 0, []error{other}, 1, other},
		{"in use, then another error", "192.0.2.6:4791", 0, []error{inUse, other}, 2, other},
		{"ephemeral port", "192.0.2.7:0", 0, []error{inUse}, 1, inUse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ap := netip.MustParseAddrPort(tc.ap)
			if tc.closedAgo >= 0 {
				noteClosed(ap)
				closedHere.mu.Lock()
				closedHere.at[ap] = closedHere.at[ap].Add(-tc.closedAgo)
				closedHere.mu.Unlock()
			}
			calls := 0
			_, err := bindRetrying(ap, func() (*net.UDPConn, error) {
				r := tc.results[min(calls, len(tc.results)-1)]
				calls++
				return nil, r
			})
			require.Equal(t, tc.wantCalls, calls)
			if tc.wantErr == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.wantErr)
			}
		})
	}
}

// TestBindRetryingGivesUp: an address closed here but held by something
// else for good is refused once rebindWindow has passed since the close,
// not retried forever.
func TestBindRetryingGivesUp(t *testing.T) {
	ap := netip.MustParseAddrPort("192.0.2.8:4791")
	noteClosed(ap)
	closedHere.mu.Lock()
	closedHere.at[ap] = closedHere.at[ap].Add(-rebindWindow + 20*time.Millisecond) // 20 ms of the window left
	closedHere.mu.Unlock()
	calls := 0
	_, err := bindRetrying(ap, func() (*net.UDPConn, error) { calls++; return nil, syscall.EADDRINUSE })
	require.ErrorIs(t, err, syscall.EADDRINUSE)
	require.Greater(t, calls, 1, "retried within the window")
}
