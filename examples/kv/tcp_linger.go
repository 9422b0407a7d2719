package kv

import (
	"bufio"
	"io"
	"net"
	"time"
)

// Bounds of lingeringClose: what a refused client may still send is read
// away up to its claimed length, at most lingerBytes, for at most
// lingerTime, after which the connection is closed whatever remains; at
// most maxLingering connections linger at once.
const (
	lingerBytes  = 32 << 20
	lingerTime   = time.Second
	maxLingering = 16
)

// lingeringClose ends a connection whose client may still be sending a
// request the server refused without reading it (claimed: the bytes of it
// still due), as HTTP servers do (Apache's lingering_close, nginx's
// lingering_time): closing a socket with unread data in its receive
// buffer makes Linux answer with RST instead of FIN (tcp_close; RFC 2525
// 2.17), and a client still writing its request then gets ECONNRESET from
// its write and never reads the refusal already sent to it. So the server
// sends FIN after the refusal (CloseWrite: the client reads the refusal,
// then EOF), reads away what the client still sends, up to the claimed
// length, at most lingerBytes, for at most s.lingerTime (a client that
// never stops costs the server no more than that), and only then closes.
// The caller closes c.
//
// Lingering is a courtesy to a client that made a mistake, and it holds
// the connection's goroutine and buffers (a few MiB, while serve sized
// them for the table's largest message; its read buffer and what its
// earlier requests grew since: connBuffers) and its place among
// TCPServerConfig.MaxConns while it lasts: a burst of refused connections, each claiming gigabytes and
// sending nothing more, held as many for a second each. So at most
// maxLingering connections linger at once (s.lingerSlots); the others are
// closed at once, after their refusal and FIN, and a client of theirs
// still writing may get the reset: the burst pays, not the server.
func (s *TCPServer) lingeringClose(c net.Conn, r *bufio.Reader, claimed int64) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	select {
	case s.lingerSlots <- struct{}{}:
		defer func() { <-s.lingerSlots }()
	default:
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(s.lingerTime))
	_, _ = io.CopyN(io.Discard, r, min(claimed, lingerBytes))
}
