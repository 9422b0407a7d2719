package daemon

import (
	"errors"
	"syscall"

	"github.com/rxed/rxed/pkg/oob"
)

// Which failed Accepts of the TCP exchange are retried. Only an error the
// next accept(2) may not repeat is worth the backoff (backoff.go): out of
// file descriptors or memory, or a connection that failed between the
// handshake and accept. Anything else (EINVAL: the socket no longer
// listens, shut down under us; EBADF or net.ErrClosed: its descriptor
// closed by something other than the daemon's shutdown) fails every time,
// so the loop was retrying it for ever, a warning a second, with the
// exchange dead and Run none the wiser. Such an error now ends the loop
// and Run (acceptLoop).

// retriedAcceptErrnos are accept(2)'s transient failures: running out of
// descriptors (EMFILE, ENFILE) or of socket buffers (ENOBUFS, ENOMEM),
// the connection aborted or reset before it was taken (ECONNABORTED,
// ECONNRESET), an interrupted or would-block call (EINTR, EAGAIN), and
// the network errors Linux passes on from the new socket, which accept(2)
// says to treat as EAGAIN (EPROTO, ENOPROTOOPT, ENETDOWN, ENETUNREACH,
// EHOSTDOWN, EHOSTUNREACH, EOPNOTSUPP; its ENONET is left out: Linux's
// alone, and the package builds for other systems too).
var retriedAcceptErrnos = []error{
	syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
	syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EINTR, syscall.EAGAIN,
	syscall.EPROTO, syscall.ENOPROTOOPT, syscall.ENETDOWN, syscall.ENETUNREACH,
	syscall.EHOSTDOWN, syscall.EHOSTUNREACH, syscall.EOPNOTSUPP,
}

// temporaryAcceptError reports whether an Accept that failed with err
// (net.Listener's, wrapped by pkg/oob) may succeed if tried again: one of
// retriedAcceptErrnos, a timeout (oob.ErrTimeout: pkg/oob keeps the
// cause, not the net.Error), or an error that says it is temporary as
// net/http's Server.Serve asks (net.Error's deprecated Temporary, read
// through an interface of our own: a *net.OpError of Op "accept" says so
// for ECONNRESET and ECONNABORTED, a syscall.Errno for EINTR, EMFILE,
// ENFILE and timeouts).
func temporaryAcceptError(err error) bool {
	for _, e := range retriedAcceptErrnos {
		if errors.Is(err, e) {
			return true
		}
	}
	if errors.Is(err, oob.ErrTimeout) {
		return true
	}
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}
