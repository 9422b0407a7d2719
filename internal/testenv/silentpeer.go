package testenv

import (
	"io"
	"net"
	"testing"
)

// SilentTCPPeer listens on loopback, accepts one connection, reads its
// first n bytes, then says so on the returned channel and answers
// nothing ever after (it reads and discards until the connection or the
// test ends): a peer whose host hung with the connection up, for tests
// that a wait on it ends with its context. The listener closes with t.
func SilentTCPPeer(t testing.TB, n int) (addr string, got <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: silent peer: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := io.ReadFull(c, make([]byte, n)); err == nil {
			close(ch)
		}
		_, _ = io.Copy(io.Discard, c)
	}()
	return ln.Addr().String(), ch
}
