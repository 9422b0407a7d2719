package main

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// TestCountersOutCountsWhatCloseSends: --counters-out holds the counters
// after the device closed, so the packets Close itself sends count: the
// connection manager's DREQ for a connection still up (and the DREP or
// the flush of a last ACK a closing tool still owes). Interop CI at
// f237cb0 (rdmacm/rping/ipv4/C10, rxed as server): the file said sent_pkts
// 61 where the tool's own pcap held 62 packets from it, the last the
// DREP, and the delivery check failed; the counters were read before
// Close.
func TestCountersOutCountsWhatCloseSends(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	log := slog.New(slog.DiscardHandler)
	counters := tempPath(t, "counters.json")
	ea := &engineFlags{addrs: addrs(a), port: transport.RoCEv2Port, countersOut: counters, peerInProcess: true}
	eb := &engineFlags{addrs: addrs(b), port: transport.RoCEv2Port, peerInProcess: true}
	enA, err := ea.open(log)
	require.NoError(t, err)
	enB, err := eb.open(log)
	require.NoError(t, err)
	t.Cleanup(func() { _ = enB.close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	srvAddr := netip.AddrPortFrom(netip.MustParseAddr(b), 7471)
	l, err := rdmacm.Listen(enB.dev, srvAddr, nil)
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan *rdmacm.Conn, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			close(accepted)
			return
		}
		c, err := req.Accept(ctx, connQP(t, enB.dev), nil)
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	_, err = rdmacm.Dial(ctx, connQP(t, enA.dev), srvAddr, nil)
	require.NoError(t, err)
	srv, ok := <-accepted
	require.True(t, ok, "the server did not accept")

	// Close with the connection up: the CM sends its DREQ during Close.
	require.NoError(t, enA.close())
	select {
	case ev := <-srv.Events():
		require.Equal(t, rdmacm.EventDisconnected, ev.Type)
	case <-ctx.Done():
		t.Fatal("the server saw no disconnect after the client's device closed")
	}
	got := readCounters(t, counters)
	// Everything A sent, and nothing else, reached B (loopback, no faults).
	require.Equal(t, enB.dev.Counters()["rcvd_pkts"], got["sent_pkts"],
		"--counters-out sent_pkts against what the peer received; counters: %v", got)
}

// connQP is an RC QP in INIT for rdmacm's Dial and Accept, made ready as
// the tools make theirs (initQPForCM).
func connQP(t *testing.T, dev *ib.Device) *ib.QP {
	t.Helper()
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	cq, err := dev.CreateCQ(16)
	require.NoError(t, err)
	q, err := pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	require.NoError(t, initQPForCM(q))
	return q
}
