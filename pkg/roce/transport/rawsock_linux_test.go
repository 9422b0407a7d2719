//go:build linux

package transport

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// openRawTest returns a rawSocket bound to 127.0.0.1 and a function that
// sends it a datagram from another socket.
func openRawTest(t *testing.T) (*rawSocket, func(string)) {
	t.Helper()
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	dst := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	r, err := newRawSocket(pc)
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	src, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { src.Close() })
	return r, func(s string) {
		_, err := src.WriteToUDPAddrPort([]byte(s), dst)
		require.NoError(t, err)
	}
}

// recvOnce is an attempt of a receive on fd: false when nothing is
// queued.
func recvOnce(fd uintptr, out *string) bool {
	buf := make([]byte, 64)
	n, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
	if errors.Is(err, unix.EAGAIN) {
		return false
	}
	if err != nil {
		*out = "error: " + err.Error()
		return true
	}
	*out = string(buf[:n])
	return true
}

// startReader runs a blocking Read in a goroutine; its datagram (or
// error) arrives on the channel.
func startReader(r *rawSocket) <-chan string { return startCountingReader(r).got }

// waitQueued returns once r's socket has a datagram queued (a loopback
// send normally delivers before it returns, but the kernel may defer
// that to ksoftirqd).
func waitQueued(t *testing.T, r *rawSocket) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for queued := 0; queued == 0; {
		require.NoError(t, r.Control(func(fd uintptr) { queued, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }))
		if queued == 0 {
			require.True(t, time.Now().Before(deadline), "the datagram never reached the socket")
			runtime.Gosched()
		}
	}
}

// countingReader is a blocking Read in a goroutine that counts its
// attempts (attempts may be read once got delivered) and signals the
// first ones that found nothing on empty (it never blocks on it: a
// covered reader may find nothing any number of times).
type countingReader struct {
	got      chan string
	empty    chan struct{}
	attempts int
}

func startCountingReader(r *rawSocket) *countingReader {
	c := &countingReader{got: make(chan string, 1), empty: make(chan struct{}, 4)}
	go func() {
		var s string
		err := r.Read(func(fd uintptr) bool {
			c.attempts++
			if recvOnce(fd, &s) {
				return true
			}
			select {
			case c.empty <- struct{}{}:
			default:
			}
			return false
		})
		if err != nil {
			s = "error: " + err.Error()
		}
		c.got <- s
	}()
	return c
}

func recvWithin(t *testing.T, got <-chan string) string {
	t.Helper()
	select {
	case s := <-got:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not return")
		return ""
	}
}

// setCoverSpan makes a cover last d for the test.
func setCoverSpan(t *testing.T, d time.Duration) {
	old := coverSpan
	coverSpan = d
	t.Cleanup(func() { coverSpan = old })
}

// coveredReader returns a socket covered for span and its reader, once
// the reader has found nothing, seen the cover and gone to sleep.
func coveredReader(t *testing.T, span time.Duration) (*rawSocket, func(string), <-chan string) {
	t.Helper()
	setCoverSpan(t, span)
	r, send := openRawTest(t)
	slept := make(chan struct{}, 8)
	r.onCoveredSleep = func() { slept <- struct{}{} }
	r.cover()
	got := startReader(r)
	<-slept
	return r, send, got
}

// A covered socket's blocked reader does not take what arrives (it is
// not even woken: its watch is off), so the poller finds it; Uncover
// puts the reader back on the socket.
func TestRawSocketCoveredReaderLeavesArrivalsToThePoller(t *testing.T) {
	r, send, got := coveredReader(t, time.Hour)

	send("first")
	var polled string
	deadline := time.Now().Add(10 * time.Second)
	for polled == "" {
		require.NoError(t, r.Control(func(fd uintptr) { recvOnce(fd, &polled) }))
		if polled == "" {
			require.True(t, time.Now().Before(deadline), "the poller never found the datagram: the covered reader took it")
			runtime.Gosched()
		}
	}
	require.Equal(t, "first", polled)
	select {
	case s := <-got:
		t.Fatalf("the covered reader returned %q", s)
	default:
	}
	require.False(t, r.rd.on, "a covered reader switches its watch off")
	require.False(t, inSet(t, &r.rd, r.fd), "and takes the socket out of rd")

	r.Uncover()
	send("second")
	require.Equal(t, "second", recvWithin(t, got))
}

// A cover lapses by itself: a spinner that stops without Uncover delays
// the reader by at most coverSpan.
func TestRawSocketCoverLapses(t *testing.T) {
	_, send, got := coveredReader(t, time.Millisecond)
	send("late")
	require.Equal(t, "late", recvWithin(t, got))
}

// A reader whose cover ends takes what came meanwhile before it switches
// its watch back on: arming the watch with a datagram queued makes rd
// readable and wakes a thread parked in the netpoller for nothing
// (measured: 0.06 -> 0.11-0.15 context switches per 8-byte WRITE round
// trip in poll mode, docs/performance.md session I).
func TestRawSocketUncoveredReaderTakesWhatCameBeforeArming(t *testing.T) {
	r, send, got := coveredReader(t, time.Hour)
	send("meanwhile")
	waitQueued(t, r)
	r.Uncover()
	require.Equal(t, "meanwhile", recvWithin(t, got))
	require.False(t, r.rd.on, "the watch stays off: the reader took the datagram before arming it")

	// The next Read finds nothing, arms the watch and waits.
	c := startCountingReader(r)
	<-c.empty
	send("later")
	require.Equal(t, "later", recvWithin(t, c.got))
	require.True(t, r.rd.on, "a reader that found nothing waits with its watch on")
	require.True(t, inSet(t, &r.rd, r.fd), "the socket back in rd")
}

func TestRawSocketCloseWakesACoveredReader(t *testing.T) {
	r, _, got := coveredReader(t, time.Hour)
	require.NoError(t, r.Close())
	require.Equal(t, "error: "+net.ErrClosed.Error(), recvWithin(t, got))
}

func TestRawSocketCloseWakesAWaitingReader(t *testing.T) {
	r, _ := openRawTest(t)
	got := startReader(r)
	require.NoError(t, r.Close())
	require.Equal(t, "error: "+net.ErrClosed.Error(), recvWithin(t, got))
	require.ErrorIs(t, r.Close(), net.ErrClosed, "twice")
	require.ErrorIs(t, r.Control(func(uintptr) {}), net.ErrClosed)
}

// A reader that has to wait makes one attempt that finds nothing, inside
// the netpoller's wait, and one more when the datagram has come. It used
// to try once more before that wait: a second empty recvmmsg on every
// wait, 0.7-0.8 us of a loopback round trip's 17-20 (docs/performance.md,
// session I).
func TestRawSocketWaitingReaderTriesOnceBeforeItWaits(t *testing.T) {
	r, send := openRawTest(t)
	c := startCountingReader(r)
	<-c.empty // the reader found nothing and waits (or is about to)
	send("after the wait")
	require.Equal(t, "after the wait", recvWithin(t, c.got))
	require.Equal(t, 2, c.attempts, "one empty attempt, one that took the datagram")
	require.Len(t, c.empty, 0, "no second empty attempt")

	// A datagram already queued is taken by the first attempt.
	send("queued")
	waitQueued(t, r)
	attempts := 0
	var s string
	require.NoError(t, r.Read(func(fd uintptr) bool { attempts++; return recvOnce(fd, &s) }))
	require.Equal(t, "queued", s)
	require.Equal(t, 1, attempts)
}

// A write that would block waits for EPOLLOUT on wr and tries again; the
// socket is in wr only for that wait.
func TestRawSocketWriteWaitsForBufferSpace(t *testing.T) {
	r, _ := openRawTest(t)
	require.False(t, inSet(t, &r.wr, r.fd), "no writer waits: the socket is not in wr")
	calls := 0
	inDuringWait := false
	require.NoError(t, r.Write(func(uintptr) bool {
		calls++
		if calls > 1 {
			inDuringWait = inSet(t, &r.wr, r.fd)
		}
		return calls > 1
	}))
	require.Equal(t, 2, calls)
	require.True(t, inDuringWait, "the waiting writer watched wr")
	require.False(t, inSet(t, &r.wr, r.fd), "and took the socket out again")

	// Writes that need no wait leave wr alone.
	require.NoError(t, r.Write(func(uintptr) bool { return true }))
	require.False(t, inSet(t, &r.wr, r.fd))
}

// A watch switched off takes the socket out of the epoll set, so that the
// kernel's wake-ups for its datagrams have nobody to call (session P:
// +105-150 ns per sendto/recvmmsg pair with each socket in two sets that
// watch nothing); switching it on puts it back, and each change is the
// one epoll_ctl it needs (no EEXIST, no ENOENT).
func TestWaitSetTakesTheSocketOutWhenOff(t *testing.T) {
	r, _ := openRawTest(t)
	w, err := newWaitSet()
	require.NoError(t, err)
	defer w.f.Close()
	for i, step := range []struct {
		events uint32
		in     bool
	}{
		{0, false},                           // off while out: nothing to do
		{unix.EPOLLIN, true},                 // added
		{unix.EPOLLIN | unix.EPOLLOUT, true}, // modified
		{0, false},                           // deleted
		{0, false},                           // still out
		{unix.EPOLLOUT | unix.EPOLLONESHOT, true}, // added again
		{0, false},
	} {
		require.NoError(t, w.watch(r.fd, step.events), "step %d", i)
		require.Equal(t, step.in, w.on, "step %d", i)
		require.Equal(t, step.in, inSet(t, &w, r.fd), "step %d", i)
	}
}

// inSet reports whether fd is in w's epoll set, from the kernel's
// /proc/self/fdinfo of the epoll descriptor.
func inSet(t *testing.T, w *waitSet, fd int) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", w.ep))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "tfd:" && f[1] == strconv.Itoa(fd) {
			return true
		}
	}
	return false
}

// Close never waits for a system call in progress (its caller may hold
// the locks that call waits for) and never closes the descriptor under
// it: the last use closes it.
func TestRawSocketCloseDuringAUse(t *testing.T) {
	r, _ := openRawTest(t)
	require.True(t, r.acquire())
	require.NoError(t, r.Close())
	_, err := unix.FcntlInt(uintptr(r.fd), unix.F_GETFD, 0)
	require.NoError(t, err, "the descriptor stays open while in use")
	require.False(t, r.acquire(), "no new use after Close")
	r.release()
	require.Equal(t, int64(fdClosing), r.refs.Load())
	require.ErrorIs(t, r.Control(func(uintptr) {}), net.ErrClosed)
}

// The socket keeps its binding and options when it leaves the
// netpoller.
func TestNewRawSocketKeepsTheBinding(t *testing.T) {
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	want := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	r, err := newRawSocket(pc)
	require.NoError(t, err)
	defer r.Close()
	var sa unix.Sockaddr
	require.NoError(t, r.Control(func(fd uintptr) { sa, err = unix.Getsockname(int(fd)) }))
	require.NoError(t, err)
	in4 := sa.(*unix.SockaddrInet4)
	require.Equal(t, want, netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)))
	fl, err := unix.FcntlInt(uintptr(r.fd), unix.F_GETFL, 0)
	require.NoError(t, err)
	require.NotZero(t, fl&unix.O_NONBLOCK, "non-blocking")
}
