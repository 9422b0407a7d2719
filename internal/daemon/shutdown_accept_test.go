package daemon

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/oob"
	"github.com/stretchr/testify/require"
)

// TestShutdownAdmitsTheClientAcceptedAsTheListenerCloses: a client that
// the accept loop took just as shutdown closed the listener is admitted
// before shutdown waits for the sessions, so its session gets the grace
// period and completes. The race (the daemon audit, session AF, fixed in
// 5f5aec8 without a deterministic test; this test, session AG): shutdown
// waited for the sessions (none yet) and cancelled their context before
// the accept loop had admitted the client, so that session ran with its
// context already over and failed, and its wg.Add ran beside the Wait.
// The hooks hold the accept loop with the client accepted until shutdown
// waits for the loop; if shutdown does not wait for it, the hook lets go
// when the sessions' context ends, and the session fails.
func TestShutdownAdmitsTheClientAcceptedAsTheListenerCloses(t *testing.T) {
	logs := newLogWatch()
	d, err := New(Config{Addrs: addrs(t, "127.0.3.235"), OOBAddr: "127.0.3.235:0", IdleTimeout: -1, ShutdownGrace: time.Minute,
		Logger: slog.New(logs), Exports: []ExportSpec{{Name: "data", Kind: ExportAnon, Size: 1 << 20}}})
	require.NoError(t, err)
	accepted, awaiting := make(chan struct{}), make(chan struct{})
	d.afterAccept = func() {
		close(accepted)
		select {
		case <-awaiting:
		case <-d.sessCtx.Done():
		}
	}
	d.awaitingAcceptLoop = func() { close(awaiting) }
	stop := runDaemon(t, d)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clientDone := make(chan error, 1)
	go func() {
		clientDone <- func() error {
			dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}
			c, err := dl.DialContext(ctx, "tcp", d.OOBAddr().String())
			if err != nil {
				return err
			}
			s := oob.NewSession(c, oob.Client, &oob.SessionConfig{Options: oob.Options{Timeout: 10 * time.Second}})
			defer s.CloseWithoutExchange()
			if _, err := s.Negotiate(ctx, 3); err != nil {
				return err
			}
			key := oob.Key{OutReads: 1, QPN: 0x44, PSN: 1, RKey: 1, VAddr: 0x1000, GID: netip.MustParseAddr("127.0.0.1").As16()}
			for range 3 { // its QP's address, then the two barriers
				if _, err := s.HandShake(ctx, key); err != nil {
					return err
				}
			}
			_, err = s.Finish(ctx, oob.Test{Verb: oob.VerbWrite}, key, oob.BWReport{})
			return err
		}()
	}()
	<-accepted
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }() // shutdown closes the listener with the client accepted, not admitted
	require.NoError(t, <-clientDone, "the client accepted as the listener closed")
	require.NoError(t, <-stopped)
	require.Equal(t, uint64(1), d.completed.Load(), "its session did not complete")
	require.Zero(t, d.failed.Load())
}
