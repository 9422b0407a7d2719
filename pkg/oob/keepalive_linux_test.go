package oob

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/netns"
	"github.com/rxed/rxed/internal/testenv"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// sockInt reads an integer socket option of c.
func sockInt(t *testing.T, c net.Conn, level, opt int) int {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	var v int
	var gerr error
	require.NoError(t, rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), level, opt) }))
	require.NoError(t, gerr)
	return v
}

// TestExchangeSocketsGetTheKeepAlive: both ends of a perftest exchange
// probe a silent peer after Options.KeepAlive (Timeout when zero), a
// probe a second, give up after KeepAliveProbes, and bound
// unacknowledged data by the same time (TCP_USER_TIMEOUT). Bug (lead's
// notes, item 5): the exchange had only Go's default keepalive, 15 s then
// 9 probes 15 s apart, and an idle rxed perf server waited on a vanished
// client for what that happened to give.
func TestExchangeSocketsGetTheKeepAlive(t *testing.T) {
	for _, tc := range []struct {
		name         string
		opts         Options
		idle, probes int
	}{
		{"from Timeout", Options{Timeout: 7 * time.Second}, 7, DefaultKeepAliveProbes},
		{"its own", Options{Timeout: 7 * time.Second, KeepAlive: 3 * time.Second, KeepAliveProbes: 2}, 3, 2},
		{"no step bound", Options{Timeout: -1}, int(DefaultTimeout / time.Second), DefaultKeepAliveProbes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cfg := &SessionConfig{Options: tc.opts}
			l, err := ListenPerftest("127.0.0.1:0", cfg)
			require.NoError(t, err)
			defer l.Close()
			cli, err := DialPerftest(ctx, l.Addr().String(), cfg)
			require.NoError(t, err)
			defer cli.CloseWithoutExchange()
			srv, err := l.Accept(ctx)
			require.NoError(t, err)
			defer srv.CloseWithoutExchange()
			for _, end := range []*Session{srv, cli} {
				c := end.s.c
				require.Equal(t, 1, sockInt(t, c, unix.SOL_SOCKET, unix.SO_KEEPALIVE), end.Role())
				require.Equal(t, tc.idle, sockInt(t, c, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE), end.Role())
				require.Equal(t, 1, sockInt(t, c, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL), end.Role())
				require.Equal(t, tc.probes, sockInt(t, c, unix.IPPROTO_TCP, unix.TCP_KEEPCNT), end.Role())
				require.Equal(t, (tc.idle+tc.probes)*1000, sockInt(t, c, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT), end.Role())
			}
		})
	}
}

// TestSilentClientEndsTheIdleServer: an ib_write_bw server idling on the
// exchange through its client's run (Finish's unbounded read) whose
// client's host vanishes (here: its namespace stops sending, so nothing
// answers, not even the kernel) ends within KeepAlive plus
// KeepAliveProbes seconds, with an error saying the client stopped
// answering. Bug (lead's notes, item 5): it waited on Go's default
// keepalive, about 2.5 minutes (perftest itself waits for ever).
func TestSilentClientEndsTheIdleServer(t *testing.T) {
	why := netns.Available()
	testenv.Need(t, why == "", "%s", why)
	name := fmt.Sprintf("rxed-oobka-%d", os.Getpid())
	srvNS, err := netns.Create(name + "-s")
	require.NoError(t, err)
	defer srvNS.Delete()
	cliNS, err := netns.Create(name + "-c")
	require.NoError(t, err)
	defer cliNS.Delete()
	// A link between the two, 10.77.0.1 (server) to 10.77.0.2 (client).
	require.NoError(t, srvNS.IP("link", "add", "oobka-s", "type", "veth", "peer", "name", "oobka-c", "netns", cliNS.Name))
	for _, e := range []struct {
		ns        *netns.NS
		dev, addr string
	}{{srvNS, "oobka-s", "10.77.0.1/24"}, {cliNS, "oobka-c", "10.77.0.2/24"}} {
		require.NoError(t, e.ns.IP("addr", "add", e.addr, "dev", e.dev))
		require.NoError(t, e.ns.IP("link", "set", e.dev, "up"))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := &SessionConfig{Options: Options{Timeout: 10 * time.Second, KeepAlive: time.Second, KeepAliveProbes: 2}}
	var l *PerftestListener
	require.NoError(t, srvNS.Do(func() (err error) { l, err = ListenPerftest("10.77.0.1:0", cfg); return err }))
	defer l.Close()
	var cli *Session
	require.NoError(t, cliNS.Do(func() (err error) { cli, err = DialPerftest(ctx, l.Addr().String(), cfg); return err }))
	defer cli.CloseWithoutExchange()
	srv, err := l.Accept(ctx)
	require.NoError(t, err)

	// The client's host goes silent: a qdisc that queues nothing drops
	// every packet it would send, the ACKs of the server's probes too.
	require.NoError(t, cliNS.Exec("tc", "qdisc", "add", "dev", "oobka-c", "root", "pfifo", "limit", "0"))
	start := time.Now()
	_, err = srv.Finish(ctx, Test{Verb: VerbWrite}, Key{}, BWReport{})
	elapsed := time.Since(start)
	require.ErrorIs(t, err, ErrClosed, "%v", err)
	require.NoError(t, ctx.Err(), "the test's own bound ended the wait: %v", err)
	require.ErrorContains(t, err, "oob: peer "+srv.RemoteAddr()+" stopped answering while we waited for the key message (got 0 of ")
	require.ErrorContains(t, err, "nothing from it for 3s, TCP keepalive probes unanswered: its host is gone or cut off")
	// 1 s idle and 2 probes a second apart; the kernel's timers are
	// coarse, the machine loaded.
	require.Less(t, elapsed, 20*time.Second, "the server noticed after %v", elapsed)
	t.Logf("the server noticed %v after its client went silent: %v", elapsed, err)
}
