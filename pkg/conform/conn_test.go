package conform

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/oob"
)

// TestBetweenServerRunsIsWhatARestartingServerGives: the errors a one-shot
// server gives while it restarts between scenarios (refused; reset at
// connect time, which failed ibv_rc_pingpong's exchange in CI at
// b36d65b; closed before the first message) are retried, as wrapped by
// net and by oob; anything else (a timeout, another refusal of the
// connection's kind, none) is not.
func TestBetweenServerRunsIsWhatARestartingServerGives(t *testing.T) {
	dial := func(errno syscall.Errno) error {
		return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", errno)}
	}
	for _, c := range []struct {
		name  string
		err   error
		retry bool
	}{
		{"refused", dial(syscall.ECONNREFUSED), true},
		{"reset at connect", dial(syscall.ECONNRESET), true},
		{"reset, as oob wraps it", fmt.Errorf("couldn't connect: %w", dial(syscall.ECONNRESET)), true},
		{"closed before the exchange", fmt.Errorf("peer: %w", oob.ErrClosed), true},
		{"timed out", fmt.Errorf("couldn't connect: %w", os.ErrDeadlineExceeded), false},
		{"unreachable", dial(syscall.ENETUNREACH), false},
		{"some other failure", errors.New("bad message"), false},
		{"none", nil, false},
	} {
		require.Equal(t, c.retry, betweenServerRuns(c.err), c.name)
	}
}
