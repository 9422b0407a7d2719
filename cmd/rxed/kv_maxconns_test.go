package main

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/examples/kv"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// TestKVServeMaxConns: kv serve --max-conns N caps both sides: a TCP
// connection beyond N is answered busy and closed as it is accepted (its
// first call fails with ErrServerBusy), an RDMA one is refused with REJ
// "kv: too many clients" (ErrServerBusy too); a freed slot serves the
// next client; kv get, turned away, says to raise --max-conns. Task: kv
// serve had no flag for TCPServerConfig.MaxConns (nor
// RDMAServerConfig.MaxConns). Bug (workload edges, task N): the TCP
// client saw ErrConnLost, as from a crash, and kv get over RDMA said
// "rejected: consumer defined (28)".
func TestKVServeMaxConns(t *testing.T) {
	srv, cli := addrPair(t)
	tcpAddr := srv + ":17472"
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	kvServeContext = func() context.Context { return ctx }
	defer func() { kvServeContext = context.Background }()
	sout, _, sdone := startCmd("kv", "serve", "--addr", srv, "--tcp", tcpAddr, "--buckets", "64", "--extent", "256", "--max-conns", "1")
	sout.waitFor(t, "kv: serving 64 buckets", 20*time.Second)
	octx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// TCP: the first connection is served, the second closed unread.
	c1, err := kv.DialTCP(octx, tcpAddr)
	require.NoError(t, err)
	require.NoError(t, c1.Put(octx, []byte("k"), []byte("over tcp")))
	c2, err := kv.DialTCP(octx, tcpAddr)
	require.NoError(t, err, "the refusal comes after the handshake")
	_, err = c2.Get(octx, []byte("k"))
	require.ErrorIs(t, err, kv.ErrServerBusy, "a second TCP connection with --max-conns 1")
	require.NotErrorIs(t, err, kv.ErrConnLost)
	c2.Close()
	r := runCmd("kv", "get", "--tcp", tcpAddr, "x", "k")
	t.Log(r.stderr)
	requireOneLineError(t, r, "rxed kv get", "server busy: too many clients", "raise --max-conns on the server")
	require.NoError(t, c1.Close())

	// RDMA: the first client holds the one slot, the second is refused.
	ef := engineFlags{addrs: addrList{netip.MustParseAddr(cli)}, port: transport.RoCEv2Port, timeout: 20 * time.Second}
	en, err := ef.open(slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer en.close()
	raddr := netip.AddrPortFrom(netip.MustParseAddr(srv), kvCMPort)
	r1, err := kv.DialRDMA(octx, en.dev, raddr, nil)
	require.NoError(t, err)
	v, err := r1.Get(octx, []byte("k"))
	require.NoError(t, err)
	require.Equal(t, "over tcp", string(v))
	_, err = kv.DialRDMA(octx, en.dev, raddr, nil)
	require.ErrorIs(t, err, kv.ErrServerBusy, "a second RDMA client with --max-conns 1")
	var rej *rdmacm.RejectError
	require.True(t, errors.As(err, &rej), "a second RDMA client with --max-conns 1: %v", err)
	require.Equal(t, "kv: too many clients", string(trimZeros(rej.PrivateData)))
	other, _ := addrPair(t) // kv get's own engine
	r = runCmd("kv", "get", "--addr", other, "--timeout", "20s", srv, "k")
	t.Log(r.stderr)
	requireOneLineError(t, r, "rxed kv get", "server busy: too many clients", "raise --max-conns on the server")
	require.NoError(t, r1.Close())

	stop()
	requireOK(t, "serve", await(t, sdone, 30*time.Second))
}

// TestKVBenchReportsABusyServer: kv bench against a running server
// (--spawn=false) whose --max-conns is below its --clients fails with the
// server's refusal and the hint, not "connection lost". Bug (workload
// edges, task N): as TestKVServeMaxConns.
func TestKVBenchReportsABusyServer(t *testing.T) {
	srv, cli := addrPair(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	kvServeContext = func() context.Context { return ctx }
	defer func() { kvServeContext = context.Background }()
	sout, _, sdone := startCmd("kv", "serve", "--addr", srv, "--tcp", srv+":17474", "--buckets", "64", "--extent", "256", "--max-conns", "1")
	sout.waitFor(t, "kv: serving 64 buckets", 20*time.Second)
	r := runCmd("kv", "bench", "--spawn=false", "--addr", cli, "--server", srv, "--tcp-port", "17474",
		"--clients", "2", "--get", "100", "-n", "1", "--keys", "2", "--buckets", "64", "--extent", "256", "-s", "8")
	t.Log(r.stderr)
	requireOneLineError(t, r, "rxed kv bench", "server busy: too many clients", "raise --max-conns on the server")
	stop()
	requireOK(t, "serve", await(t, sdone, 30*time.Second))
}

// trimZeros drops the zero padding of a REJ's private data.
func trimZeros(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}

// TestKVServeMaxConnsFlag: --max-conns takes at least 1 (the servers' 0
// would be their default, quietly); the RDMA side's bound is ServeRDMA's.
func TestKVServeMaxConnsFlag(t *testing.T) {
	require.NoError(t, kvMaxConns(1))
	require.NoError(t, kvMaxConns(kv.DefaultMaxConns))
	requireOneLineError(t, runCmd("kv", "serve", "--addr", "127.0.2.1", "--max-conns", "0"), "--max-conns 0: want at least 1 (default 256)")
	requireOneLineError(t, runCmd("kv", "serve", "--addr", "127.0.2.1", "--max-conns", "-3"), "--max-conns -3: want at least 1")
	r := runCmd("kv", "serve", "--addr", "127.0.2.1", "--max-conns", "many")
	require.Equal(t, 2, r.code)
	requireOneLineError(t, r, "invalid value \"many\" for flag -max-conns")
	// Beyond the RDMA server's CQ: ServeRDMA says so, as the server starts.
	srv, _ := addrPair(t)
	requireOneLineError(t, runCmd("kv", "serve", "--addr", srv, "--tcp", srv+":17472", "--max-conns", "7000"), "rxed kv serve: kv: MaxConns 7000: want 0 (the default, 256) to 6553")
}
