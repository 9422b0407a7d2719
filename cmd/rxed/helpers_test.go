package main

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Address plan: these tests use 127.0.2.1 .. 127.0.2.254 (UDP 4791) and
// TCP ports from reservePort (held for the test's lifetime, so no other
// test or process gets them), so they run next to other packages' tests.
// Each test takes its own pair of addresses and gives it back when it
// ends, so -count=N does not run out; free addresses are reused oldest
// first, keeping a just-released one idle as long as possible.
var (
	addrMu    sync.Mutex
	freeAddrs = func() []int {
		f := make([]int, 0, 254)
		for i := 1; i <= 254; i++ {
			f = append(f, i)
		}
		return f
	}()
)

// addrPair returns two addresses no other running test in this package
// uses, until the test ends.
func addrPair(t *testing.T) (string, string) {
	t.Helper()
	addrMu.Lock()
	defer addrMu.Unlock()
	require.GreaterOrEqual(t, len(freeAddrs), 2, "out of 127.0.2.x addresses: more than 127 tests at once")
	a, b := freeAddrs[0], freeAddrs[1]
	freeAddrs = freeAddrs[2:]
	t.Cleanup(func() {
		// Registered first, so it runs after the test's other cleanups:
		// whatever the test started must have let go of the addresses.
		for _, i := range []int{a, b} {
			if err := checkUnbound("127.0.2." + strconv.Itoa(i)); err != nil {
				t.Errorf("the test left something bound: %v (a command still running?)", err)
				return // the pair stays out of the pool
			}
		}
		addrMu.Lock()
		defer addrMu.Unlock()
		freeAddrs = append(freeAddrs, a, b)
	})
	return "127.0.2." + strconv.Itoa(a), "127.0.2." + strconv.Itoa(b)
}

// checkUnbound reports whether UDP 4791 of addr can be bound, as the next
// test given addr will bind it, waiting up to a second for the kernel to
// release a socket closed a moment ago (transport's rebindWindow says
// why it can lag). A command left running holds it for good:
// TestConformAgainstServe left its daemon running, and a test handed the
// address later failed to bind it.
func checkUnbound(addr string) error {
	deadline := time.Now().Add(time.Second)
	for {
		c, err := net.ListenPacket("udp4", net.JoinHostPort(addr, "4791"))
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// syncBuffer is an io.Writer safe for concurrent use that can wait for
// text to appear.
type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{}
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{changed: make(chan struct{})} }

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.b.Write(p)
	close(s.changed)
	s.changed = make(chan struct{})
	return n, err
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor blocks until the buffer contains sub (or fails the test after
// d), woken by every write.
func (s *syncBuffer) waitFor(t *testing.T, sub string, d time.Duration) {
	t.Helper()
	s.waitForCount(t, sub, 1, d)
}

// waitForCount is waitFor for n occurrences of sub.
func (s *syncBuffer) waitForCount(t *testing.T, sub string, n int, d time.Duration) {
	t.Helper()
	timeout := time.After(d)
	for {
		s.mu.Lock()
		has := strings.Count(s.b.String(), sub) >= n
		ch := s.changed
		s.mu.Unlock()
		if has {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("%q did not appear %d times within %v; output so far:\n%s", sub, n, d, s.String())
		}
	}
}

// result is a finished command.
type result struct {
	code           int
	stdout, stderr string
}

// startCmd runs rxed with args in a goroutine.
func startCmd(args ...string) (out, errOut *syncBuffer, done <-chan result) {
	out, errOut = newSyncBuffer(), newSyncBuffer()
	ch := make(chan result, 1)
	go func() {
		code := run(args, out, errOut)
		ch <- result{code, out.String(), errOut.String()}
	}()
	return out, errOut, ch
}

// runCmd runs rxed with args to completion.
func runCmd(args ...string) result {
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

func await(t *testing.T, ch <-chan result, d time.Duration) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		t.Fatalf("command did not finish within %v", d)
	}
	return result{}
}

// runPair starts the server command, waits until it listens (ready is a
// line it prints once listening), runs the client, and returns both
// results.
func runPair(t *testing.T, server []string, ready string, client []string) (srv, cli result) {
	t.Helper()
	sout, _, sdone := startCmd(server...)
	select {
	case r := <-sdone:
		t.Fatalf("server exited early with %d:\n%s\n%s", r.code, r.stdout, r.stderr)
	default:
	}
	sout.waitFor(t, ready, 20*time.Second)
	cli = runCmd(client...)
	srv = await(t, sdone, 60*time.Second)
	return srv, cli
}

// requireOK fails with both outputs unless the command exited 0.
func requireOK(t *testing.T, name string, r result) {
	t.Helper()
	require.Equalf(t, 0, r.code, "%s exited %d\nstdout:\n%s\nstderr:\n%s", name, r.code, r.stdout, r.stderr)
}

// requireOneLineError checks a failed command printed exactly one line
// containing every want.
func requireOneLineError(t *testing.T, r result, want ...string) {
	t.Helper()
	require.NotEqualf(t, 0, r.code, "expected failure; stdout:\n%s", r.stdout)
	msg := strings.TrimRight(r.stderr, "\n")
	require.NotEmpty(t, msg, "no error message")
	require.NotContainsf(t, msg, "\n", "error is more than one line:\n%s", r.stderr)
	for _, w := range want {
		require.Containsf(t, msg, w, "error %q does not name %q", msg, w)
	}
}

// tcpPeer listens on host (port 0) until the test ends and runs serve on
// each connection it accepts, in a goroutine of its own, closing the
// connection when serve returns: a fake peer for the tools' TCP
// exchanges. It returns the listener's address.
func tcpPeer(t *testing.T, host string, serve func(c net.Conn)) *net.TCPAddr {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); serve(c) }()
		}
	}()
	return ln.Addr().(*net.TCPAddr)
}

// closingListener is a tcpPeer that closes every connection at once: a
// TCP peer that speaks nothing.
func closingListener(t *testing.T, host string) *net.TCPAddr {
	t.Helper()
	return tcpPeer(t, host, func(net.Conn) {})
}

// readCounters parses a --counters-out file.
func readCounters(t *testing.T, path string) map[string]uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var m map[string]uint64
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

func tempPath(t *testing.T, name string) string { return filepath.Join(t.TempDir(), name) }
