package main

import (
	"errors"
	"fmt"
	"syscall"
)

// The system errors a newcomer meets first (a second server on the same
// port, an --addr that is not the host's, a client started before its
// server) came out as the kernel's words alone ("bind: address already in
// use"), which say what failed but not what to do. These helpers add the
// next step to the one-line error.

// engineOpenError is the error of an engine that could not bind its UDP
// socket, with what to do about it. The cause is formatted, not wrapped,
// so fail's generic hint (nextStep) does not repeat it.
func engineOpenError(what, addrs string, port uint, err error) error {
	var hint string
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		hint = fmt.Sprintf(": another engine already has udp/%d there (an rxed tool or daemon, or the kernel's rdma_rxe on that address): stop it, or give this one another address", port)
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		hint = ": not an address of this host (ip addr lists them; for two engines on one host, add one: ip addr add 10.0.0.2/32 dev lo, or use 127.0.0.x)"
	}
	where := addrs
	if port != 0 { // 0: an ephemeral port (devinfo), never in use
		where += fmt.Sprintf(" udp/%d", port)
	}
	return fmt.Errorf("opening %s on %s: %v%s", what, where, err, hint)
}

// nextStep is the hint fail adds to an error whose cause is one of the
// common socket errors of the TCP exchanges and listeners ("" for any
// other).
func nextStep(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return " (nothing listens there: start the server first, and give both sides the same port)"
	case errors.Is(err, syscall.EADDRINUSE):
		return " (another process has that address and port, an earlier rxed perhaps, or the kernel's rdma_rxe for udp/4791: stop it, or give this one another address or port, and its clients the same)"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return " (not an address of this host: ip addr lists them)"
	}
	return ""
}
