package kv

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/internal/testenv"
)

// TestServersCloseLeaveNoGoroutine: with a client of each kind connected
// and served, closing the RDMA and TCP servers (clients still up) leaves
// no goroutine of the package: the accept, handler and keepalive loops,
// the connections' watchers and the TCP connections' goroutines are all
// joined by Close. A guard written by the goroutine audit (session AG).
func TestServersCloseLeaveNoGoroutine(t *testing.T) {
	leaks := testenv.SnapshotGoroutines("github.com/rxed/rxed/examples/kv")
	r := newRig(t)
	ctx := ctxT(t)
	rc, tc := r.rdmaClient(), r.tcpClient()
	require.NoError(t, rc.Put(ctx, []byte("k"), []byte("v")))
	v, err := tc.Get(ctx, []byte("k"))
	require.NoError(t, err)
	require.Equal(t, "v", string(v))
	require.NoError(t, r.rdma.Close())
	require.NoError(t, r.tcp.Close())
	// The clients own no goroutine; the servers' are all gone.
	leaks.CheckNoneLeft(t)
}
