package main

import (
	"net"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// reservePort returns a TCP port that stays reserved for this test until
// it ends, so the tools' listeners (-p, --metrics) can bind it and nobody
// else can get it in between.
//
// Why this is race-free on Linux: the port is held by a socket bound to
// the wildcard address with SO_REUSEADDR that never listens. The kernel
// skips a port bound like that both when it picks a port for bind(port 0)
// (another test's listener or reservation) and when it picks a source port
// for connect(), so no ephemeral allocation anywhere on the machine can
// take it. A listener that names the port explicitly, as the tools do
// through net.Listen (which sets SO_REUSEADDR), may share it with a
// bound socket that is not listening, so the tool's bind succeeds.
// Connecting to the port while nothing listens is refused, which is what
// the "nothing listens there" tests need.
//
// The check-then-bind helper this replaces (listen on port 0, close,
// return the number) left a window in which a parallel test's connect or
// listen could take the port, so tools failed with "address already in
// use" under load.
func reservePort(t testing.TB) string {
	t.Helper()
	// Dual-stack [::] covers 0.0.0.0 and 127.0.0.1 binds too; a kernel
	// without IPv6 gets the IPv4 wildcard.
	fd, sa, err := reserveOn(syscall.AF_INET6, &syscall.SockaddrInet6{})
	if err != nil {
		fd, sa, err = reserveOn(syscall.AF_INET, &syscall.SockaddrInet4{})
	}
	require.NoError(t, err, "reserving a TCP port")
	t.Cleanup(func() { syscall.Close(fd) })
	var port int
	switch a := sa.(type) {
	case *syscall.SockaddrInet6:
		port = a.Port
	case *syscall.SockaddrInet4:
		port = a.Port
	}
	require.Positive(t, port, "reserved socket has no port")
	return strconv.Itoa(port)
}

// reserveOn binds a non-listening SO_REUSEADDR TCP socket of family to
// the wildcard address and a kernel-chosen port.
func reserveOn(family int, wildcard syscall.Sockaddr) (int, syscall.Sockaddr, error) {
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, nil, err
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		syscall.Close(fd)
		return -1, nil, err
	}
	if err := syscall.Bind(fd, wildcard); err != nil {
		syscall.Close(fd)
		return -1, nil, err
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return -1, nil, err
	}
	return fd, sa, nil
}

// TestReservePort checks the kernel behaviour reservePort relies on: the
// tools' own binds of the port succeed, nothing answers on it, and no
// kernel-chosen port (for a listener on port 0 or a connect's source port)
// lands on a reserved one. With 300 of the ~28000 ephemeral ports
// reserved, 600 listeners and 600 connections would hit one about a dozen
// times if the reservation did not hold.
func TestReservePort(t *testing.T) {
	p := reservePort(t)
	for _, addr := range []string{":" + p, "127.0.0.1:" + p} {
		ln, err := net.Listen("tcp", addr)
		require.NoError(t, err, "a tool's listener on the reserved port")
		c, err := net.Dial("tcp", "127.0.0.1:"+p)
		require.NoError(t, err)
		c.Close()
		require.NoError(t, ln.Close())
	}
	_, err := net.Dial("tcp", "127.0.0.1:"+p)
	require.ErrorIs(t, err, syscall.ECONNREFUSED, "nothing listens on a reserved port")

	reserved := map[int]bool{}
	for range 300 {
		n, err := strconv.Atoi(reservePort(t))
		require.NoError(t, err)
		reserved[n] = true
	}
	require.Equal(t, 300, len(reserved), "a port was reserved twice")
	srv := closingListener(t, "127.0.0.1")
	for range 600 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		lp := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		require.False(t, reserved[lp], "listener on port 0 got reserved port %d", lp)
		c, err := net.Dial("tcp", srv.String())
		require.NoError(t, err)
		cp := c.LocalAddr().(*net.TCPAddr).Port
		c.Close()
		require.False(t, reserved[cp], "connection got reserved source port %d", cp)
	}
}
