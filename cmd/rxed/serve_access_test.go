package main

import (
	"context"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/oob"
	"github.com/stretchr/testify/require"
)

// TestServeListenAndAllow: --listen binds the exchange to one address
// only; --allow refuses clients outside the listed networks before a byte
// is exchanged, and serves those inside.
func TestServeListenAndAllow(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port, port2 := reservePort(t), reservePort(t)
	d, _, _, _ := startServe(t, "--addr", a, "-p", port, "--listen", a, "--export", "data=anon,size=64K", "--allow", "10.0.0.0/8")
	require.Equal(t, net.JoinHostPort(a, port), d.OOBAddr().String())
	_, err := net.DialTimeout("tcp", "127.0.0.1:"+port, 5*time.Second)
	require.Error(t, err, "the exchange listens on %s only", a)

	// perf's connection comes from 127.0.0.1: not in 10/8.
	r := runCmd("perf", "write", "--addr", b, "-p", port, "-s", "4096", "-n", "10", "--timeout", "5s", "--progress", "0", a)
	require.NotEqual(t, 0, r.code)
	require.Contains(t, r.stderr, "connection closed")
	require.Contains(t, d.Metrics(), "rxed_sessions_refused_address_total 1")
	require.Zero(t, d.Device().Counters()["sent_pkts"])

	udp := strconv.Itoa(freeUDPPort(t, a))
	_, _, _, _ = startServe(t, "--addr", a, "--port", udp, "-p", port2, "--export", "data=anon,size=64K",
		"--allow", "10.0.0.0/8", "--allow", "127.0.0.1")
	r = runCmd("perf", "write", "--addr", b, "--port", udp, "-p", port2, "-s", "4096", "-n", "10", "--progress", "0", a)
	requireOK(t, "perf write from an allowed address", r)
}

// TestServeToken: in token mode only clients that prove the shared
// secret get a session (and the rkey); the others are refused before any
// QP exists, each with a message that says why; a perftest client, which
// cannot send a token, sees the connection closed.
func TestServeToken(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port := reservePort(t)
	tok := tempPath(t, "token")
	require.NoError(t, os.WriteFile(tok, []byte("correct horse battery staple\n"), 0o600))
	d, logs, _, _ := startServe(t, "--addr", a, "-p", port, "--export", "data=anon,size=64K", "--token-file", tok)
	perf := func(extra ...string) result {
		args := append([]string{"perf", "write", "--addr", b, "-p", port, "-s", "4096", "-n", "20", "--timeout", "5s", "--progress", "0"}, extra...)
		return runCmd(append(args, a)...)
	}
	r := perf()
	require.NotEqual(t, 0, r.code)
	require.Contains(t, r.stderr, "requires a token")
	r = perf("--token", "guess")
	require.NotEqual(t, 0, r.code)
	require.Contains(t, r.stderr, "did not accept our token")
	require.Zero(t, d.Device().Counters()["sent_pkts"], "no QP was connected for a refused client")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := oob.DialPerftest(ctx, net.JoinHostPort(a, port), &oob.SessionConfig{Options: oob.Options{Timeout: 5 * time.Second}})
	require.NoError(t, err)
	_, err = s.Negotiate(ctx, 3)
	require.ErrorIs(t, err, oob.ErrClosed, "a perftest client cannot prove a token")
	s.CloseWithoutExchange()
	logs.waitFor(t, "token mode", 10*time.Second)

	r = perf("--token-file", tok)
	requireOK(t, "perf write with the token", r)
	r = perf("--token", "correct horse battery staple")
	requireOK(t, "perf write with --token", r)
}
