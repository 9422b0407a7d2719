package main

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/cm/cmtest"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// cmSide is one perf -R process's device on an in-memory network: its
// CM runs on a clock that only the test moves, and its close lingers an
// hour, so a close that returns did not wait for any timewait.
type cmSide struct {
	dev   *ib.Device
	pd    *ib.PD
	cq    *ib.CQ
	clock *cmtest.FakeClock
}

func newCMSide(t *testing.T, net *transport.MemNetwork, ip string) *cmSide {
	t.Helper()
	c, err := net.Listen(netip.AddrPortFrom(netip.MustParseAddr(ip), transport.RoCEv2Port))
	require.NoError(t, err)
	dev, err := ib.OpenDevice(ib.Config{Conn: c, Workers: 1})
	require.NoError(t, err)
	clock := cmtest.NewFakeClock(time.Unix(0, 0))
	require.NoError(t, rdmacm.Enable(dev, &rdmacm.Config{Clock: clock, Linger: time.Hour}))
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	cq, err := dev.CreateCQ(64)
	require.NoError(t, err)
	return &cmSide{dev: dev, pd: pd, cq: cq, clock: clock}
}

func (s *cmSide) qp(t *testing.T) *ib.QP {
	t.Helper()
	q, err := s.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: ib.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	return q
}

// TestPerfRDMACMClientExitsWithoutTimewait: a perf -R client ends as the
// active side of every DREQ (its DREP came: nothing can need an answer
// from it), so its device closes at once, whatever the linger; the
// server, which answered the DREQs, is the one that sits out timewait.
// The server used to disconnect the control connection as soon as the
// test connections were gone, crossing (or beating) the client's DREQ,
// and every rxed perf -R client exited a timewait (2 s) late.
func TestPerfRDMACMClientExitsWithoutTimewait(t *testing.T) {
	t.Parallel()
	net := transport.NewMemNetwork()
	srv, cli := newCMSide(t, net, "10.9.0.1"), newCMSide(t, net, "10.9.0.2")
	t.Cleanup(func() {
		// A failed test's lingering closes end with timewait.
		srv.clock.Advance(time.Minute)
		cli.clock.Advance(time.Minute)
		_ = srv.dev.Close()
		_ = cli.dev.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ln, err := rdmacm.Listen(srv.dev, netip.MustParseAddrPort("0.0.0.0:18515"), nil)
	require.NoError(t, err)
	defer ln.Close()
	raddr := netip.MustParseAddrPort("10.9.0.1:18515")
	// The control connection, then two test connections, as perftest -R
	// makes them.
	var srvConns, cliConns []*rdmacm.Conn
	for range 3 {
		accepted := make(chan *rdmacm.Conn, 1)
		sq := srv.qp(t)
		go func() {
			req, err := ln.Accept(ctx)
			if err != nil {
				accepted <- nil
				return
			}
			c, _ := req.Accept(ctx, sq, nil)
			accepted <- c
		}()
		c, err := rdmacm.Dial(ctx, cli.qp(t), raddr, nil)
		require.NoError(t, err)
		s := <-accepted
		require.NotNil(t, s)
		cliConns, srvConns = append(cliConns, c), append(srvConns, s)
	}

	srvDone := make(chan struct{})
	go func() {
		endPerfConns(true, srvConns[1:], srvConns[0], 20*time.Second)
		close(srvDone)
	}()
	endPerfConns(false, cliConns[1:], cliConns[0], 20*time.Second)
	require.True(t, testenv.ReturnsWithin(func() { _ = cli.dev.Close() }, 10*time.Second),
		"the client's device close waited for its linger: it answered a DREQ of the server's instead of sending every DREQ itself")

	<-srvDone
	for _, c := range srvConns {
		require.ErrorIs(t, c.Err(), rdmacm.ErrDisconnected)
	}
	// The server answered every DREQ and lingers through their timewait;
	// once it is over (2 s on the CM's clock), it closes.
	srv.clock.Advance(time.Minute)
	require.True(t, testenv.ReturnsWithin(func() { _ = srv.dev.Close() }, 20*time.Second), "the server's close still lingered after its timewait")
}
