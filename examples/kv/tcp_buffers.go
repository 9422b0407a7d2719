package kv

import (
	"bufio"
	"io"
	"net"
)

// connBuffers are one TCP connection's buffers, each allocated when a
// message first needs it and grown to the largest message since. serve
// used to allocate them all as it accepted the connection, sized for the
// table's largest message (a bufio of twice it, the message and the
// response: about 1 MiB with 256 KiB extents, 4 MiB with 1 MiB ones), so
// a flood of connections cost that much each whether or not they ever
// sent a request (TestTCPServerAllocatesBuffersLazily). Owned by the
// connection's goroutine.
type connBuffers struct {
	c      net.Conn
	maxMsg int // the table's largest request
	hdr    [reqHdrLen]byte
	// r buffers the connection's reads from its first request on; nil
	// before (a connection that never sends costs no buffer).
	r   *bufio.Reader
	msg []byte // the largest request so far
	out []byte // the largest response so far (appends grow it)
}

// readBufSize is a connection's read buffer. It gathers a small request's
// header and body (and any request behind it) into one read; a body
// longer than it is read straight into msg (bufio reads past its buffer
// when it is empty), so it need not scale with the table.
const readBufSize = 4 << 10

func newConnBuffers(c net.Conn, maxMsg int) *connBuffers {
	return &connBuffers{c: c, maxMsg: maxMsg}
}

// readHeader reads the next request's header into b.hdr. The first is
// read from the connection itself, and the read buffer comes after it.
func (b *connBuffers) readHeader() error {
	if b.r == nil {
		if _, err := io.ReadFull(b.c, b.hdr[:]); err != nil {
			return err
		}
		b.r = bufio.NewReaderSize(b.c, readBufSize)
		return nil
	}
	_, err := io.ReadFull(b.r, b.hdr[:])
	return err
}

// message returns the request buffer of n bytes (n <= maxMsg) with the
// header in place, grown if it is too small: to n, or to twice its size
// (at most maxMsg) so that a client's growing values do not reallocate
// every time.
func (b *connBuffers) message(n int) []byte {
	if cap(b.msg) < n {
		b.msg = make([]byte, n, min(max(n, 2*cap(b.msg)), b.maxMsg))
	}
	m := b.msg[:n]
	copy(m, b.hdr[:])
	return m
}
