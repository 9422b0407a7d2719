package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// silencingConn is a host's link the test cuts: once silent, the host
// sends nothing more (killed with SIGKILL, or gone: no DREQ, no ACK).
type silencingConn struct {
	transport.Conn
	silent atomic.Bool
}

func (c *silencingConn) Send(bufs [][]byte, ep transport.Endpoint) error {
	if c.silent.Load() {
		return nil
	}
	return c.Conn.Send(bufs, ep)
}

// ctrlPair is a server's control connection and its client's, over an
// in-memory network; the server's engine runs on fc.
type ctrlPair struct {
	srv, cli *CMControl
	link     *silencingConn // the client's
}

func newCtrlPair(t *testing.T, fc *roce.FakeClock, srvCfg, cliCfg CMControlConfig) *ctrlPair {
	t.Helper()
	n := transport.NewMemNetwork()
	open := func(ip string, wrap func(transport.Conn) transport.Conn, clk roce.Clock) (*ib.Device, *ib.PD) {
		c, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr(ip), transport.RoCEv2Port))
		require.NoError(t, err)
		dev, err := ib.OpenDevice(ib.Config{Conn: wrap(c), Clock: clk})
		require.NoError(t, err)
		t.Cleanup(func() { _ = dev.Close() })
		pd, err := dev.AllocPD()
		require.NoError(t, err)
		return dev, pd
	}
	p := &ctrlPair{}
	sdev, spd := open("10.0.7.1", func(c transport.Conn) transport.Conn { return c }, fc)
	cdev, cpd := open("10.0.7.2", func(c transport.Conn) transport.Conn { p.link = &silencingConn{Conn: c}; return p.link }, nil)
	var err error
	srvCfg.Role, srvCfg.Timeout, cliCfg.Role, cliCfg.Timeout = oob.Server, 5*time.Second, oob.Client, 5*time.Second
	p.srv, err = NewCMControl(sdev, spd, srvCfg)
	require.NoError(t, err)
	t.Cleanup(p.srv.Close)
	p.cli, err = NewCMControl(cdev, cpd, cliCfg)
	require.NoError(t, err)
	t.Cleanup(p.cli.Close)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	addr := netip.MustParseAddrPort("10.0.7.1:18515")
	ln, err := rdmacm.Listen(sdev, addr, nil)
	require.NoError(t, err)
	defer ln.Close()
	param := &rdmacm.ConnParam{RetryCount: 7, RNRRetryCount: 7, ACKTimeout: 14}
	accepted := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err == nil {
			var c *rdmacm.Conn
			if c, err = req.Accept(ctx, p.srv.QP(), param); err == nil {
				p.srv.Attach(c)
			}
		}
		accepted <- err
	}()
	c, err := rdmacm.Dial(ctx, p.cli.QP(), addr, param)
	require.NoError(t, err)
	p.cli.Attach(c)
	require.NoError(t, <-accepted)
	return p
}

// stepClock advances fc to its next deadline whenever take accepts it,
// until done is closed or until is true. Each step is an event: the
// timer the test moves past fires, and what it makes happen (a probe, a
// retransmission) arms the next. The engine arms its timers from its own
// goroutines, so a deadline take refuses is waited for, not overtaken.
func stepClock(t *testing.T, fc *roce.FakeClock, done <-chan struct{}, until func() bool, take func(d time.Time) bool) {
	t.Helper()
	start := fc.Now()
	deadline := time.After(20 * time.Second)
	for until == nil || !until() {
		select {
		case <-done:
			return
		case <-deadline:
			t.Fatalf("no outcome after %v of fake time", fc.Now().Sub(start))
		default:
		}
		if d, ok := fc.NextDeadline(); ok && take(d) {
			fc.Advance(d.Sub(fc.Now()))
			continue
		}
		// Nothing to take yet: the server has not reached its wait, or
		// its engine has a timer the test leaves alone (an outstanding
		// probe's retransmission, until the ACK stops it).
		time.Sleep(time.Millisecond)
	}
}

// logCount counts the records of msg w holds.
func logCount(w *logWatch, msg string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

// TestCMControlKeepAliveEndsTheIdleWait: a perf -R server idles in Finish
// through its client's run; every KeepAlive without a completion it
// probes the client with a zero-length RDMA WRITE, which a live client
// acknowledges (the wait goes on), and one that vanished without a DREQ
// (SIGKILL, host lost: its link goes silent) does not, so the wait ends
// with a clear error within KeepAlive plus the QP's retries. Bug
// (newcomer walkthrough, item 1): the wait had no liveness check, and the
// server waited for ever.
func TestCMControlKeepAliveEndsTheIdleWait(t *testing.T) {
	fc := roce.NewFakeClock(time.Unix(3_000_000, 0))
	const keepAlive = 30 * time.Second
	w := newLogWatch()
	p := newCtrlPair(t, fc, CMControlConfig{KeepAlive: keepAlive, Clock: fc, Log: slog.New(w)}, CMControlConfig{})

	finished := make(chan struct{})
	var ferr error
	go func() {
		defer close(finished)
		_, ferr = p.srv.Finish(context.Background(), oob.Test{Verb: oob.VerbWrite}, oob.Key{QPN: 1}, oob.BWReport{})
	}()

	// Only the keepalive's deadline, a KeepAlive ahead: the probe's
	// retransmission timer is left alone, so a live client's ACK is never
	// overtaken however late it comes.
	keepAliveDue := func(d time.Time) bool { return !d.Before(fc.Now().Add(keepAlive / 2)) }

	// Alive: probed three times, each acknowledged; the wait goes on.
	start := fc.Now()
	stepClock(t, fc, finished, func() bool { return logCount(w, "rdma_cm control keepalive acknowledged") >= 3 }, keepAliveDue)
	select {
	case <-finished:
		t.Fatalf("the idle wait ended with a live client: %v", ferr)
	default:
	}
	require.GreaterOrEqual(t, fc.Now().Sub(start), 3*keepAlive)

	// The client vanishes: the next probe goes unanswered, and the QP's
	// retries (the engine's timers alone) run out.
	p.link.silent.Store(true)
	silenced := fc.Now()
	stepClock(t, fc, finished, func() bool { return logCount(w, "rdma_cm control keepalive sent") >= 4 }, keepAliveDue)
	probed := fc.Now()
	stepClock(t, fc, finished, nil, func(d time.Time) bool { return d.Before(probed.Add(keepAlive / 2)) })
	require.Error(t, ferr)
	require.True(t, errors.Is(ferr, oob.ErrClosed), "%v", ferr)
	require.ErrorContains(t, ferr, "rdma_cm control connection with 10.0.7.2:")
	require.ErrorContains(t, ferr, "the peer stopped answering: the keepalive on the idle connection (a zero-length RDMA WRITE) ended in RETRY_EXC_ERR")
	// KeepAlive, then retry_cnt 7 retries of the ACK timeout (4.096 us
	// << 14: 67 ms) after the first send, and the requester's quicker
	// resends, which spend no retry.
	elapsed := fc.Now().Sub(silenced)
	require.LessOrEqual(t, elapsed, keepAlive+8*(4096<<14)*time.Nanosecond+time.Second, "the server noticed after %v", elapsed)
	t.Logf("the server noticed %v after its client vanished: %v", elapsed, ferr)
}

// TestCMControlSendRetryExceededSaysThePeerIsGone: a control-connection
// SEND (a key message, a barrier, the report) to a peer that vanished
// without a DREQ ends in RETRY_EXC_ERR, and the error says the peer
// stopped answering, as the keepalive's does. Bug reference: only the
// keepalive's failure named the cause; a SEND's said "control QP
// completion RETRY_EXC_ERR", no hint to a perf -R user that the client
// or server had gone (rping and perftest users read status 12 so).
func TestCMControlSendRetryExceededSaysThePeerIsGone(t *testing.T) {
	fc := roce.NewFakeClock(time.Unix(4_000_000, 0))
	p := newCtrlPair(t, fc, CMControlConfig{Clock: fc}, CMControlConfig{})
	p.link.silent.Store(true) // the client takes our SEND but never ACKs it

	finished := make(chan struct{})
	var err error
	go func() {
		defer close(finished)
		err = p.srv.send(context.Background(), make([]byte, CMKeyLen), "key message")
	}()
	// Every deadline is the SEND's retransmission (the engine's timers
	// alone, no keepalive): the QP's retries run out.
	stepClock(t, fc, finished, nil, func(time.Time) bool { return true })
	require.EqualError(t, err, "rdma_cm control connection with "+p.srv.peer+": key message: the peer stopped answering: "+
		"our SEND on the control connection ended in RETRY_EXC_ERR (no ACK through the QP's retries), "+
		"so its process was killed or its host is gone: connection closed")
	require.ErrorIs(t, err, oob.ErrClosed)
}
