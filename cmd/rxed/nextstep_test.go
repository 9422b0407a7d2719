package main

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// The socket errors a newcomer meets first say what to do next, not only
// the kernel's words. Bug (newcomer walkthrough of docs/tools.md): a
// second server on the same address, an rping client without -I on the
// server's host, an --addr that is not the host's and a client started
// before its server ended in "bind: address already in use", "bind:
// cannot assign requested address" and "connect: connection refused"
// alone.

// TestEngineAddressInUseSaysWhatToDo: udp/4791 of --addr already taken.
func TestEngineAddressInUseSaysWhatToDo(t *testing.T) {
	a, _ := addrPair(t)
	held, err := net.ListenPacket("udp4", net.JoinHostPort(a, "4791"))
	require.NoError(t, err)
	defer held.Close()
	r := runCmd("pingpong", "--addr", a, "-p", reservePort(t))
	requireOneLineError(t, r, "rxed pingpong: opening the RoCE engine on "+a+" udp/4791", "address already in use",
		"another engine already has udp/4791 there", "give this one another address")
	require.Equal(t, 1, r.code)

	// The daemon's engine opens through internal/daemon: same advice.
	r = runCmd("serve", "--addr", a, "--export", "x=anon,size=4K", "-p", "0")
	requireOneLineError(t, r, "rxed serve: opening the RoCE engine", "address already in use", "stop it, or give this one another address or port")
}

// TestEngineAddressNotOnHostSaysWhatToDo: an --addr no interface has
// (192.0.2.1, TEST-NET-1).
func TestEngineAddressNotOnHostSaysWhatToDo(t *testing.T) {
	for _, args := range [][]string{
		{"pingpong", "--addr", "192.0.2.1", "127.0.0.1"},
		{"devinfo", "--addr", "192.0.2.1"},
	} {
		r := runCmd(args...)
		requireOneLineError(t, r, "rxed "+args[0]+": opening the", "on 192.0.2.1", "cannot assign requested address",
			"not an address of this host (ip addr lists them")
		require.Equal(t, 1, r.code, "%v", args)
	}
}

// TestTCPSocketErrorsSayWhatToDo: a client with no server, a server whose
// exchange port or metrics port is taken.
func TestTCPSocketErrorsSayWhatToDo(t *testing.T) {
	a, b := addrPair(t)
	free := reservePort(t) // bound, not listening: connect is refused
	r := runCmd("pingpong", "--addr", b, "-p", free, a)
	requireOneLineError(t, r, "couldn't connect to "+a+":"+free, "connection refused", "nothing listens there: start the server first")
	r = runCmd("perf", "tcp", "-p", free, a)
	requireOneLineError(t, r, "connection refused", "nothing listens there: start the server first")

	ln, err := net.Listen("tcp", net.JoinHostPort(a, "0"))
	require.NoError(t, err)
	defer ln.Close()
	taken := ln.Addr().String()
	r = runCmd("pingpong", "--addr", a, "--listen", taken)
	requireOneLineError(t, r, "couldn't listen on "+taken, "address already in use", "another process has that address and port")
	r = runCmd("serve", "--addr", a, "--export", "x=anon,size=4K", "-p", "0", "--metrics", taken)
	requireOneLineError(t, r, "rxed serve: metrics listener", "address already in use", "another process has that address and port")
}
