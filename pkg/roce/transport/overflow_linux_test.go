//go:build linux

package transport

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestDropRcvbufCounted overflows a small socket receive buffer, then
// checks that the datagrams the kernel dropped are counted (SO_RXQ_OVFL:
// the count arrives with the next datagram queued after the drops).
func TestDropRcvbufCounted(t *testing.T) {
	open := func(a string, buf int) Conn {
		c, err := OpenUDP(UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr(a)}, SocketBufferBytes: buf, DisableGRO: true})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	snd, rcv := open("127.0.0.1", 0), open("127.0.0.2", 4096)
	to := Endpoint{Remote: rcv.LocalAddrs()[0]}
	const sent = 200
	d := make([]byte, 1000)
	for range sent {
		require.NoError(t, snd.Send([][]byte{d}, to))
	}
	// Loopback delivery is synchronous: what did not fit is dropped now.
	st := rcv.(StatsReporter).Stats()
	require.Zero(t, st.DropRcvbuf, "nothing received yet, so nothing learnt")
	// Drain what the buffer held (a handful of datagrams).
	got := 0
	bufs, sizes, eps := make([][]byte, 8), make([]int, 8), make([]Endpoint, 8)
	for i := range bufs {
		bufs[i] = make([]byte, MaxDatagramSize)
	}
	for readableNow(t, rcv) {
		n, err := rcv.Receive(bufs, sizes, eps)
		require.NoError(t, err)
		got += n
	}
	require.Less(t, got, sent, "a 4 KiB buffer cannot hold 200 KB")
	// The next datagram carries the kernel's drop count.
	require.NoError(t, snd.Send([][]byte{d}, to))
	require.Len(t, receiveN(t, rcv, 1, MaxDatagramSize), 1)
	st = rcv.(StatsReporter).Stats()
	require.Equal(t, uint64(sent-got), st.DropRcvbuf, "received %d of %d", got, sent)
}

// readableNow reports whether rcv has a datagram queued.
func readableNow(t *testing.T, c Conn) bool {
	t.Helper()
	s := c.(*udpConn).socks[0]
	queued := false
	require.NoError(t, s.sys.rc.Control(func(fd uintptr) {
		n, err := unixIoctlInq(int(fd))
		queued = err == nil && n > 0
	}))
	return queued
}

func unixIoctlInq(fd int) (int, error) { return unix.IoctlGetInt(fd, unix.SIOCINQ) }
