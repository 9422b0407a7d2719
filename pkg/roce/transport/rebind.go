package transport

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"
)

// A socket this process closed can keep its address for a moment after
// close(2) returns, with nothing of ours left to wait for: a process
// another goroutine is starting (os/exec) holds a copy of every
// descriptor from its fork until its exec closes the close-on-exec ones,
// and the runtime wakes the parent (and lets go of syscall.ForkLock)
// before the child gets there (closing under ForkLock still failed 278
// times in 2,000); and an epoll_wait polling the socket may hold its file
// for that moment (recent kernels take a reference while they poll an
// item), leaving the release to that thread. A device closed
// and opened again on the same address then failed with "address already
// in use": 1,773 times in 2,000 while another goroutine ran /bin/true in a
// loop (TestReopenWhileForking), and now and then in cmd/rxed's tests,
// whose tools run one after another on the same address.
//
// So a bind refused with EADDRINUSE is tried again, for up to
// rebindWindow after this process closed a socket bound to that very
// address and port (closedHere), and not otherwise: an address another
// process (or a socket of ours still open) holds fails at once, as
// before.
const rebindWindow = time.Second

// closedHere remembers when this process last closed a socket bound to
// each address and port, for rebindWindow.
var closedHere struct {
	mu sync.Mutex
	at map[netip.AddrPort]time.Time
}

// noteClosed records that a socket bound to ap was closed now.
func noteClosed(ap netip.AddrPort) {
	now := time.Now()
	closedHere.mu.Lock()
	defer closedHere.mu.Unlock()
	if closedHere.at == nil {
		closedHere.at = make(map[netip.AddrPort]time.Time)
	}
	for k, t := range closedHere.at { // closes are rare: keep it small
		if now.Sub(t) > rebindWindow {
			delete(closedHere.at, k)
		}
	}
	closedHere.at[ap] = now
}

// rebindDeadline is when retrying a refused bind of ap stops: rebindWindow
// after this process last closed a socket bound to ap, or the zero time
// when it has not within the window.
func rebindDeadline(ap netip.AddrPort) time.Time {
	closedHere.mu.Lock()
	defer closedHere.mu.Unlock()
	t, ok := closedHere.at[ap]
	if !ok {
		return time.Time{}
	}
	return t.Add(rebindWindow)
}

// listenUDP is net.ListenUDP on ap, a bind refused with EADDRINUSE tried
// again while bindRetrying says so.
func listenUDP(network string, ap netip.AddrPort) (*net.UDPConn, error) {
	return bindRetrying(ap, func() (*net.UDPConn, error) { return net.ListenUDP(network, net.UDPAddrFromAddrPort(ap)) })
}

// bindRetrying calls bind until it succeeds, fails with something other
// than EADDRINUSE, or ap was not closed here recently (rebindDeadline).
// There is no event for the kernel's release of the old socket, so it
// polls, every 200 us at first and at most every 5 ms.
func bindRetrying(ap netip.AddrPort, bind func() (*net.UDPConn, error)) (*net.UDPConn, error) {
	pc, err := bind()
	if err == nil || !errors.Is(err, syscall.EADDRINUSE) || ap.Port() == 0 {
		return pc, err
	}
	deadline := rebindDeadline(ap)
	for wait := 200 * time.Microsecond; time.Now().Before(deadline); wait = min(2*wait, 5*time.Millisecond) {
		time.Sleep(wait)
		if pc, err = bind(); err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			return pc, err
		}
	}
	return pc, err
}
