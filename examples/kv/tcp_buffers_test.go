package kv

import (
	"bufio"
	"bytes"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// heapAllocated is the bytes the process has allocated so far.
func heapAllocated() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.TotalAlloc
}

// A TCP connection costs the server no buffer until its first request,
// and then buffers as large as its messages, not the table's largest
// message: 16 connections that send nothing cost well under 16 KiB each
// (goroutine stacks aside), a GET of a small value a few KiB, a PUT of a
// 64 KiB value about that. Bug (workload review, task BF): serve
// allocated its bufio (2 x the largest message), its message and its
// response buffer as it accepted, about 1 MiB per connection with
// 256 KiB extents (4 MiB with 1 MiB ones), so a flood of connections that
// sent nothing cost memory whether or not they were ever used.
func TestTCPServerAllocatesBuffersLazily(t *testing.T) {
	const n, idleBound = 16, 16 << 10
	s := serveTCPForTest(t, bigExtentApp(t), nil)
	before := heapAllocated()
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", s.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		conns[i] = c
	}
	require.Eventually(t, func() bool { return s.connCount() == n }, 10*time.Second, time.Millisecond, "the server accepted every connection")
	idle := heapAllocated() - before
	t.Logf("%d idle connections: %d bytes allocated, %d each", n, idle, idle/n)
	require.Less(t, idle/n, uint64(idleBound), "bytes allocated per connection that sent nothing")

	c, br := conns[0], bufio.NewReader(conns[0])
	val := bytes.Repeat([]byte("v"), 64<<10)
	get := append(rawRequest(opGet, 1, 1, 0), 'k')
	put := append(append(rawRequest(opPut, 2, 1, uint32(len(val))), 'k'), val...)
	before = heapAllocated()
	resp, _ := rawCall(t, c, br, get)
	require.Equal(t, statusNotFound, resp.status)
	small := heapAllocated() - before
	t.Logf("a GET's buffers: %d bytes", small)
	require.Less(t, small, uint64(idleBound), "a small request's buffers")

	before = heapAllocated()
	resp, _ = rawCall(t, c, br, put)
	require.Equal(t, statusOK, resp.status)
	big := heapAllocated() - before
	t.Logf("a 64 KiB PUT's buffers: %d bytes", big)
	require.Less(t, big, uint64(2*len(val)), "a 64 KiB request's buffers")
	resp, v := rawCall(t, c, br, get)
	require.Equal(t, statusOK, resp.status)
	require.Equal(t, val, v)
}
