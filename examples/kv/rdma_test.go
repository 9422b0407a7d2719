package kv

import (
	"bytes"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRDMAPutGetDelete(t *testing.T) {
	r := newRig(t)
	c := r.rdmaClient()
	ctx := ctxT(t)

	_, err := c.Get(ctx, []byte("nope"))
	require.ErrorIs(t, err, ErrNotFound)
	require.NoError(t, c.Put(ctx, []byte("small"), []byte("inline value")))
	big := bytes.Repeat([]byte("0123456789"), 50)
	require.NoError(t, c.Put(ctx, []byte("big"), big))

	before := c.Stats()
	v, err := c.Get(ctx, []byte("small"))
	require.NoError(t, err)
	require.Equal(t, "inline value", string(v))
	mid := c.Stats()
	require.Equal(t, uint64(1), mid.Reads-before.Reads, "an inline value is one READ")
	v, err = c.Get(ctx, []byte("big"))
	require.NoError(t, err)
	require.Equal(t, big, v)
	require.Equal(t, uint64(2), c.Stats().Reads-mid.Reads, "an extent value is bucket + value")

	require.NoError(t, c.Delete(ctx, []byte("small")))
	_, err = c.Get(ctx, []byte("small"))
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorIs(t, c.Delete(ctx, []byte("small")), ErrNotFound)

	// Bad input is refused by the client or answered by the server.
	require.ErrorIs(t, c.Put(ctx, nil, []byte("v")), ErrKeyLen)
	require.ErrorIs(t, c.Put(ctx, []byte("k"), make([]byte, testTable.ExtentSize+1)), ErrValueLen)

	// The server application ran for the PUTs and DELETEs only.
	rs, _ := r.app.Stats()
	require.Equal(t, uint64(0), rs.Gets)
	require.Equal(t, uint64(2), rs.Puts)
	require.Equal(t, uint64(2), rs.Deletes)

	// The same table over TCP.
	tc := r.tcpClient()
	v, err = tc.Get(ctx, []byte("big"))
	require.NoError(t, err)
	require.Equal(t, big, v)
	_, err = tc.Get(ctx, []byte("small"))
	require.ErrorIs(t, err, ErrNotFound)
	_, ts, err := tc.ServerStats(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(2), ts.Gets)
}

// A bucket READ that lands while the server is writing sees an odd
// version and is retried; once the write is done the GET returns the new
// value.
func TestRDMAGetRetriesWhileWriting(t *testing.T) {
	for _, size := range []int{40, 400} { // inline, extent
		for _, ahead := range []int{0, 448} { // the bucket alone, the extent beside it
			r := newRig(t)
			c := r.rdmaClient()
			ctx := ctxT(t)
			key := []byte("k")
			require.NoError(t, c.Put(ctx, key, bytes.Repeat([]byte("a"), size)))
			at, _ := r.app.table.find(key)

			var verdicts []step
			r.app.table.midWrite = func() {
				r.app.table.midWrite = nil
				c.readAhead = ahead
				_, st, err := c.getAt(ctx, at, key)
				require.NoError(t, err)
				verdicts = append(verdicts, st)
			}
			require.NoError(t, r.app.table.Put(key, bytes.Repeat([]byte("b"), size)))
			require.Equal(t, []step{stepRetry}, verdicts, "size %d, read-ahead %d", size, ahead)
			require.Equal(t, uint64(1), c.Stats().RetryWriting)
			require.Equal(t, uint64(min(ahead, 1)), c.Stats().ReadAheads)
			v, err := c.Get(ctx, key)
			require.NoError(t, err)
			require.Equal(t, bytes.Repeat([]byte("b"), size), v)
		}
	}
}

// A READ that copied a bucket half old, half new (even version, bytes that
// do not match its checksum) is detected as torn and retried.
func TestRDMAGetDetectsTornBucket(t *testing.T) {
	r := newRig(t)
	c := r.rdmaClient()
	ctx := ctxT(t)
	key := []byte("torn")
	require.NoError(t, c.Put(ctx, key, []byte("inline value")))
	at, _ := r.app.table.find(key)
	b := r.app.table.bucket(at)

	for _, off := range []int{offKey, offValLen, offInline + 3} {
		saved := b[off]
		b[off] ^= 0x55 // what a copy racing a writer could hold
		_, st, err := c.getAt(ctx, at, key)
		b[off] = saved
		require.NoError(t, err)
		require.Equal(t, stepRetry, st, "offset %d", off)
	}
	require.Equal(t, uint64(3), c.Stats().RetryTorn)
	v, err := c.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, "inline value", string(v))
}

// A write that completes between the bucket READ and the value READ makes
// the value disagree with the bucket's checksum: stale, read again.
func TestRDMAGetDetectsStaleValue(t *testing.T) {
	r := newRig(t)
	c := r.rdmaClient()
	ctx := ctxT(t)
	key := []byte("stale")
	oldV, newV := bytes.Repeat([]byte("o"), 300), bytes.Repeat([]byte("n"), 300)
	require.NoError(t, c.Put(ctx, key, oldV))
	injected := 0
	c.afterBucketRead = func() {
		if injected == 0 {
			injected++
			require.NoError(t, r.app.table.Put(key, newV))
		}
	}
	v, err := c.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, newV, v)
	require.Equal(t, 1, injected)
	require.Equal(t, uint64(1), c.Stats().RetryStale)
}

// A server that closes (or restarts) under connected clients gives each a
// clear error; they reconnect to the new instance, which serves the same
// table with a new registration.
func TestRDMAServerRestart(t *testing.T) {
	r := newRig(t)
	ctx := ctxT(t)
	c1, c2 := r.rdmaClient(), r.rdmaClient()
	require.NoError(t, c1.Put(ctx, []byte("survives"), []byte("the restart")))
	epoch := c1.Epoch()

	require.NoError(t, r.rdma.Close())
	for _, c := range []*RDMAClient{c1, c2} {
		_, err := c.Get(ctx, []byte("survives"))
		require.ErrorIs(t, err, ErrConnLost)
		require.ErrorContains(t, err, "connection to 10.0.0.1:7471 lost")
		var lost *ConnLostError
		require.True(t, errors.As(err, &lost))
		require.ErrorIs(t, c.Put(ctx, []byte("x"), []byte("y")), ErrConnLost)
	}

	// Nobody listens: reconnecting fails with the CM's answer.
	require.Error(t, c1.Reconnect(ctx))

	var err error
	r.rdma, err = ServeRDMA(r.app, r.srvDev, r.cmAddr, nil)
	require.NoError(t, err)
	for _, c := range []*RDMAClient{c1, c2} {
		require.NoError(t, c.Reconnect(ctx))
		require.NotEqual(t, epoch, c.Epoch())
		v, err := c.Get(ctx, []byte("survives"))
		require.NoError(t, err)
		require.Equal(t, "the restart", string(v))
	}
}

func TestTCPServerRestart(t *testing.T) {
	r := newRig(t)
	ctx := ctxT(t)
	c := r.tcpClient()
	require.NoError(t, c.Put(ctx, []byte("k"), []byte("v")))
	require.NoError(t, r.tcp.Close())
	_, err := c.Get(ctx, []byte("k"))
	require.ErrorIs(t, err, ErrConnLost)
	require.ErrorContains(t, err, "lost")
	ln := listenAgain(t, r.tcpAddr)
	r.tcp = ServeTCP(r.app, ln)
	require.NoError(t, c.Reconnect(ctx))
	v, err := c.Get(ctx, []byte("k"))
	require.NoError(t, err)
	require.Equal(t, "v", string(v))
}

// A client waits hybrid unless told to sleep at once, and GETs and PUTs
// complete either way: spinning, the client's own polls receive the
// replies; sleeping, the engine's receive goroutine delivers them.
func TestRDMAClientWaitsAsConfigured(t *testing.T) {
	r := newRig(t)
	ctx := ctxT(t)
	for _, c := range []struct {
		name string
		cfg  *RDMAClientConfig
		spin time.Duration // the waiter's base budget, ib.HybridWaiter's
	}{
		{"default", nil, 0},
		{"spin 80us", &RDMAClientConfig{Spin: 80 * time.Microsecond}, 80 * time.Microsecond},
		{"sleep at once", &RDMAClientConfig{Spin: -1}, -1},
	} {
		cl, err := DialRDMA(ctx, r.cliDev, r.cmAddr, c.cfg)
		require.NoError(t, err, c.name)
		require.Equal(t, c.spin, cl.waiter.Spin, c.name)
		key, val := []byte("k-"+c.name), []byte("v-"+c.name)
		require.NoError(t, cl.Put(ctx, key, val), c.name)
		for range 50 {
			got, err := cl.Get(ctx, key)
			require.NoError(t, err, c.name)
			require.Equal(t, val, got, c.name)
		}
		require.NoError(t, cl.Close(), c.name)
	}
}

// The handlers' CPU is measured only when asked for (their goroutines
// are then locked to their threads); otherwise CPUNanos stays 0.
func TestHandlerCPUMeasuredOnlyWhenAsked(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("thread CPU time is read on Linux only (cpu_linux.go)")
	}
	for _, measure := range []bool{false, true} {
		r := newRigWith(t, func(a *App) {
			if measure {
				a.MeasureHandlerCPU()
			}
		})
		ctx := ctxT(t)
		c, tc := r.rdmaClient(), r.tcpClient()
		for i := range 20 {
			require.NoError(t, c.Put(ctx, []byte("k"), []byte{byte(i)}))
			require.NoError(t, tc.Put(ctx, []byte("t"), []byte{byte(i)}))
		}
		rs, ts := r.app.Stats()
		require.Equal(t, uint64(20), rs.Puts)
		require.Equal(t, uint64(20), ts.Puts)
		if measure {
			require.Positive(t, rs.CPUNanos, "RDMA handler CPU")
			require.Positive(t, ts.CPUNanos, "TCP handler CPU")
		} else {
			require.Zero(t, rs.CPUNanos, "RDMA handler CPU, not measured")
			require.Zero(t, ts.CPUNanos, "TCP handler CPU, not measured")
		}
	}
}
