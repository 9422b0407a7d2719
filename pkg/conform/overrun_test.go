package conform

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/oob"
)

// Scenarios that overrun their deadline: the runner takes back what the
// body holds (the exchange's listener, the TCP session, the UDP link, the
// tool's waiter) before the next scenario starts, reports the overrun as
// an ERROR, and the next scenario binds the very same ports and passes.
// The bodies here ignore their context on purpose; the fake peers are
// pkg/oob's own client and server, on loopback.

var loopback = netip.MustParseAddr("127.0.0.1")

// freePorts picks a free TCP port (the exchange) and a free UDP port (the
// RoCE link) on loopback.
func freePorts(t *testing.T) (tcp, udp uint16) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tcp = uint16(ln.Addr().(*net.TCPAddr).Port)
	require.NoError(t, ln.Close())
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	udp = uint16(pc.LocalAddr().(*net.UDPAddr).Port)
	require.NoError(t, pc.Close())
	return tcp, udp
}

// onListening installs the listening hook for one test.
func onListening(t *testing.T, f func(net.Addr)) {
	old := listening
	listening = f
	t.Cleanup(func() { listening = old })
}

var writeTest = oob.Test{Verb: oob.VerbWrite}

// fakeClient plays the peer's ib_write_bw client against addr: the whole
// exchange, then the closing exchange; it reports how the session ended.
func fakeClient(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sess, err := oob.DialPerftest(ctx, addr, &oob.SessionConfig{Options: oob.Options{Timeout: 20 * time.Second}})
	if err != nil {
		return err
	}
	if _, err := sess.Negotiate(ctx, oob.MTUEnum(1024)); err != nil {
		return err
	}
	key := oob.Key{OutReads: 16, QPN: 0x4711, PSN: 0x100, GID: loopback.As16()}
	if _, err := sess.Connect(ctx, writeTest, []oob.Key{key}, nil); err != nil {
		return err
	}
	_, err = sess.Finish(ctx, writeTest, key, oob.BWReport{Size: 8, Iters: 1})
	return err
}

// lateBody is what a released overrunning body found.
type lateBody struct {
	sendErr, openErr error
}

// blockingBody signals running with its connection, ignores its context
// until release, then reports whether its link and its scope are still
// usable (they must not be).
func blockingBody(running chan<- *Conn, release <-chan struct{}, late chan<- lateBody) func(context.Context, *Conn) Outcome {
	return func(_ context.Context, c *Conn) Outcome {
		running <- c
		<-release
		lb := lateBody{sendErr: c.SendRaw([]byte{0}, "late body")}
		if l, err := c.sc.openLink(c.flow.Src, c.flow.Dst); err != nil {
			lb.openErr = err
		} else {
			_ = l.Close()
		}
		late <- lb
		return Passf("a late body's verdict must not be reported")
	}
}

func passingBody(_ context.Context, c *Conn) Outcome {
	return Passf("bound %s", c.flow.Src)
}

func requireOverrun(t *testing.T, r Result, timeout time.Duration, elapsed time.Duration) {
	t.Helper()
	require.Equal(t, Error, r.Verdict, r.Evidence)
	require.Contains(t, r.Evidence, "deadline exceeded")
	require.Contains(t, r.Evidence, "abandoned")
	require.Less(t, elapsed, timeout+2*bodyGrace+5*time.Second, "the runner waited past its bounds")
}

// TestConformOverrunServeReleasesPorts: in requester mode (the engine serves the
// peer's client) scenario N's body blocks after the exchange, holding the
// session, the link and the tool's waiter; Run reports it and returns with
// all of them closed, and scenario N+1 listens on the same exchange port,
// binds the same RoCE port and passes.
func TestConformOverrunServeReleasesPorts(t *testing.T) {
	oobPort, rocePort := freePorts(t)
	cfg := Config{Tool: IBWriteBW, Local: loopback, OOBPort: oobPort, RoCEPort: rocePort, Serve: true, Timeout: 2 * time.Second}
	addr := net.JoinHostPort(loopback.String(), strconv.Itoa(int(oobPort)))
	clients := make(chan error, 2)
	onListening(t, func(a net.Addr) {
		if a.String() != addr {
			t.Errorf("listening on %s, want %s", a, addr)
		}
		go func() { clients <- fakeClient(addr) }()
	})
	running, release, late := make(chan *Conn, 1), make(chan struct{}), make(chan lateBody, 1)
	n := &Scenario{ID: "T-OVERRUN", Role: PeerRequester, Tools: []Tool{IBWriteBW}, Run: blockingBody(running, release, late)}
	next := &Scenario{ID: "T-NEXT", Role: PeerRequester, Tools: []Tool{IBWriteBW}, Run: passingBody}

	start := time.Now()
	r := Run(context.Background(), cfg, n)
	requireOverrun(t, r, cfg.Timeout, time.Since(start))
	<-running // the body is still blocked: Run did not wait for it
	require.NoError(t, <-clients, "the peer's client of the overrun scenario")

	r2 := Run(context.Background(), cfg, next)
	require.Equal(t, Pass, r2.Verdict, r2.Evidence)
	require.Equal(t, netip.AddrPortFrom(loopback, rocePort).String(), r2.Local)
	require.NoError(t, <-clients, "the next scenario's client finished its run")

	close(release)
	lb := <-late
	require.ErrorIs(t, lb.sendErr, net.ErrClosed, "the overrun body's link was not closed")
	require.ErrorIs(t, lb.openErr, errScopeEnded, "a late body could open a socket")
}

// TestConformOverrunAcceptReleasesListener: scenario N stalls in its accept
// phase with the exchange's TCP listener open (the interop failure: the
// next scenarios could not listen, "address already in use"). The runner
// closes the listener when the deadline passes; scenario N+1 listens on
// the same port and passes while N is still stalled.
func TestConformOverrunAcceptReleasesListener(t *testing.T) {
	oobPort, rocePort := freePorts(t)
	cfg := Config{Tool: IBWriteBW, Local: loopback, OOBPort: oobPort, RoCEPort: rocePort, Serve: true, Timeout: 200 * time.Millisecond}
	addr := net.JoinHostPort(loopback.String(), strconv.Itoa(int(oobPort)))
	var calls atomic.Int32
	stalled, release, resumed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	clients := make(chan error, 1)
	onListening(t, func(a net.Addr) {
		if calls.Add(1) == 1 {
			close(stalled)
			<-release // ignores the scenario's context
			close(resumed)
			return
		}
		go func() { clients <- fakeClient(addr) }()
	})
	bodyRan := make(chan struct{}, 1)
	n := &Scenario{ID: "T-STALL", Role: PeerRequester, Tools: []Tool{IBWriteBW}, Run: func(context.Context, *Conn) Outcome {
		bodyRan <- struct{}{}
		return Passf("unreachable")
	}}
	next := &Scenario{ID: "T-NEXT", Role: PeerRequester, Tools: []Tool{IBWriteBW}, Run: passingBody}

	start := time.Now()
	r := Run(context.Background(), cfg, n)
	requireOverrun(t, r, cfg.Timeout, time.Since(start))
	<-stalled

	cfg.Timeout = 10 * time.Second
	r2 := Run(context.Background(), cfg, next)
	require.Equal(t, Pass, r2.Verdict, r2.Evidence)
	require.NoError(t, <-clients)

	// Released, the stalled accept phase finds its listener closed and
	// never reaches the body.
	close(release)
	<-resumed
	select {
	case <-bodyRan:
		t.Fatal("the overrun scenario's body ran after its deadline")
	default:
	}
}

// TestConformOverrunDialReleasesLink: in responder mode (the engine is the
// client of the peer's server) scenario N's body blocks holding its
// session and UDP link; the runner closes both (the peer's server sees
// its exchange end), and scenario N+1 binds the same RoCE port and passes.
func TestConformOverrunDialReleasesLink(t *testing.T) {
	_, rocePort := freePorts(t)
	ln, err := oob.ListenPerftest("127.0.0.1:0", &oob.SessionConfig{Options: oob.Options{Timeout: 20 * time.Second}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	servers := make(chan error, 2)
	go func() {
		for {
			sess, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				servers <- func() error {
					if _, err := sess.Negotiate(ctx, oob.MTUEnum(1024)); err != nil {
						return err
					}
					key := oob.Key{OutReads: 16, QPN: 0x4712, PSN: 0x200, RKey: 0x99, VAddr: 0x10000, GID: loopback.As16()}
					if _, err := sess.Connect(ctx, writeTest, []oob.Key{key}, nil); err != nil {
						return err
					}
					_, err := sess.Finish(ctx, writeTest, key, oob.BWReport{Size: 8, Iters: 1})
					return err
				}()
			}()
		}
	}()
	cfg := Config{Tool: IBWriteBW, Local: loopback, Peer: loopback, OOBPort: uint16(ln.Addr().(*net.TCPAddr).Port),
		RoCEPort: rocePort, Timeout: 2 * time.Second}
	running, release, late := make(chan *Conn, 1), make(chan struct{}), make(chan lateBody, 1)
	n := &Scenario{ID: "T-OVERRUN", Role: PeerResponder, Tools: []Tool{IBWriteBW}, Run: blockingBody(running, release, late)}
	next := &Scenario{ID: "T-NEXT", Role: PeerResponder, Tools: []Tool{IBWriteBW}, Run: passingBody}

	start := time.Now()
	r := Run(context.Background(), cfg, n)
	requireOverrun(t, r, cfg.Timeout, time.Since(start))
	<-running
	err = <-servers
	require.ErrorIs(t, err, oob.ErrClosed, "the peer's server of the overrun scenario: its exchange must be closed, got %v", err)

	r2 := Run(context.Background(), cfg, next)
	require.Equal(t, Pass, r2.Verdict, r2.Evidence)
	require.NoError(t, <-servers, "the next scenario closed its exchange")

	close(release)
	lb := <-late
	require.ErrorIs(t, lb.sendErr, net.ErrClosed)
	require.True(t, errors.Is(lb.openErr, errScopeEnded), "a late body could open a socket: %v", lb.openErr)
}
