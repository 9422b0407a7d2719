package kv

import (
	"bytes"
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What a cutConn drops of what its host sends.
const (
	cutNone     int32 = iota
	cutAll            // everything: the host died (no DREQ, no ACK)
	cutACKs           // RC ACKs: the host requests and receives, but what it receives is never acknowledged
	cutAfterACK       // all but the next RC ACK: the host died after acknowledging, before what it sent beside the ACK (the engine may batch a response before the ACK)
)

// cutConn is a client host's link that the test cuts.
type cutConn struct {
	transport.Conn
	mode atomic.Int32
}

func (c *cutConn) Send(bufs [][]byte, ep transport.Endpoint) error {
	switch c.mode.Load() {
	case cutAll:
		return nil
	case cutAfterACK:
		for _, b := range bufs {
			if len(b) > 0 && wire.Opcode(b[0]) == wire.RCAck {
				c.mode.Store(cutAll)
				return c.Conn.Send([][]byte{b}, ep)
			}
		}
		return nil
	case cutACKs:
		var kept [][]byte
		for _, b := range bufs {
			if len(b) > 0 && wire.Opcode(b[0]) == wire.RCAck {
				continue
			}
			kept = append(kept, b)
		}
		if len(kept) == 0 {
			return nil
		}
		return c.Conn.Send(kept, ep)
	}
	return c.Conn.Send(bufs, ep)
}

// newCutRig is newRig's table served with cfg, and a client device on
// 10.0.0.3 whose link the test can cut.
func newCutRig(t *testing.T, cfg *RDMAServerConfig) (*rig, *ib.Device, *cutConn) {
	t.Helper()
	r := newRig(t)
	require.NoError(t, r.rdma.Close())
	var err error
	r.rdma, err = ServeRDMA(r.app, r.srvDev, r.cmAddr, cfg)
	require.NoError(t, err)
	c, err := r.net.Listen(netip.AddrPortFrom(netip.MustParseAddr("10.0.0.3"), transport.RoCEv2Port))
	require.NoError(t, err)
	cut := &cutConn{Conn: c}
	dev, err := ib.OpenDevice(ib.Config{Conn: cut})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dev.Close() })
	return r, dev, cut
}

// onlyConn is the server's one connection.
func onlyConn(t *testing.T, s *RDMAServer) *serverConn {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Len(t, s.conns, 1)
	for _, c := range s.conns {
		return c
	}
	return nil
}

// requireRefused dials and expects the server's full-house REJ.
func requireRefused(t *testing.T, r *rig) {
	t.Helper()
	_, err := DialRDMA(ctxT(t), r.cliDev, r.cmAddr, nil)
	var rej *rdmacm.RejectError
	require.ErrorAs(t, err, &rej)
	require.True(t, bytes.HasPrefix(rej.PrivateData, []byte("kv: too many clients")), "REJ private data %q", rej.PrivateData)
}

// requireFreed waits until the server's connection c is gone: its slot,
// its QP and its region (mrsBefore: the server device's regions while c
// was there); then a client dials into the slot.
func requireFreed(t *testing.T, r *rig, c *serverConn, mrsBefore int) *RDMAClient {
	t.Helper()
	gone := func() (slot, qp, mr bool) {
		_, _, err := c.qp.Query()
		_, mrs, _ := r.srvDev.Engine().Memory().Counts()
		return r.rdma.Conns() == 0, errors.Is(err, ib.ErrDestroyed), mrs == mrsBefore-1
	}
	if !assert.Eventually(t, func() bool {
		slot, qp, mr := gone()
		return slot && qp && mr
	}, 20*time.Second, time.Millisecond) {
		slot, qp, mr := gone()
		t.Fatalf("the dead client: slot freed %v, QP destroyed %v, region deregistered %v", slot, qp, mr)
	}
	b, err := DialRDMA(ctxT(t), r.cliDev, r.cmAddr, nil)
	require.NoError(t, err, "a new client takes the slot")
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// A client that vanishes without a DREQ (its host stops sending) is
// found by the keepalive, and its slot, QP and region are freed: at the
// connection limit, a new client then gets in. An idle client that
// answers is probed and kept.
func TestRDMAKeepAliveFreesVanishedClient(t *testing.T) {
	r, devA, cut := newCutRig(t, &RDMAServerConfig{KeepAlive: 20 * time.Millisecond, MaxConns: 1})
	s := r.rdma
	ctx := ctxT(t)
	a, err := DialRDMA(ctx, devA, r.cmAddr, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	require.NoError(t, a.Put(ctx, []byte("k"), []byte("v")))
	c := onlyConn(t, s)
	attr, _, err := c.qp.Query()
	require.NoError(t, err)
	require.Equal(t, uint8(DefaultServerACKTimeout), attr.Timeout, "the server's ACK timeout, not the REQ's")
	requireRefused(t, r)

	// Idle and alive: probed, acknowledged, kept.
	require.Eventually(t, func() bool { return s.probesAcked.Load() >= 3 }, 20*time.Second, time.Millisecond,
		"keepalives acknowledged")
	require.Equal(t, 1, s.Conns())
	v, err := a.Get(ctx, []byte("k"))
	require.NoError(t, err)
	require.Equal(t, "v", string(v))

	_, mrs, _ := r.srvDev.Engine().Memory().Counts()
	cut.mode.Store(cutAll)
	b := requireFreed(t, r, c, mrs)
	v, err = b.Get(ctx, []byte("k"))
	require.NoError(t, err)
	require.Equal(t, "v", string(v))
	require.NoError(t, b.Put(ctx, []byte("k"), []byte("w")))
	requireRefused(t, r)
}

// Without keepalives, a connection one of whose completions fails is
// freed too: the client sends its PUT and receives the response, but
// never acknowledges it, so the response SEND runs out of retries.
func TestRDMAFailedResponseFreesClient(t *testing.T) {
	r, devA, cut := newCutRig(t, &RDMAServerConfig{KeepAlive: -1, MaxConns: 1})
	ctx := ctxT(t)
	a, err := DialRDMA(ctx, devA, r.cmAddr, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	c := onlyConn(t, r.rdma)
	_, mrs, _ := r.srvDev.Engine().Memory().Counts()

	cut.mode.Store(cutACKs)
	require.NoError(t, a.Put(ctx, []byte("k"), []byte("v")), "the response arrives; its ACK does not")
	b := requireFreed(t, r, c, mrs)
	v, err := b.Get(ctx, []byte("k"))
	require.NoError(t, err)
	require.Equal(t, "v", string(v))
	require.Zero(t, r.rdma.probesAcked.Load(), "no keepalives when they are off")
}

// RDMAServerConfig's zero values are the defaults; values out of range
// are refused before anything is allocated.
func TestRDMAServerConfig(t *testing.T) {
	r := newRig(t)
	at := netip.MustParseAddrPort("10.0.0.1:7480")
	for _, cfg := range []RDMAServerConfig{
		{MaxConns: -1},
		{MaxConns: ib.MaxCQE},
		{ACKTimeout: 32},
	} {
		_, err := ServeRDMA(r.app, r.srvDev, at, &cfg)
		require.Error(t, err, "%+v", cfg)
	}
	pds, mrs, _ := r.srvDev.Engine().Memory().Counts()

	s, err := ServeRDMA(r.app, r.srvDev, at, nil)
	require.NoError(t, err)
	require.Equal(t, DefaultKeepAlive, s.keepAlive)
	require.Equal(t, DefaultMaxConns, s.maxConns)
	require.Equal(t, uint8(DefaultServerACKTimeout), s.ackTO)
	require.NoError(t, s.Close())

	s, err = ServeRDMA(r.app, r.srvDev, at, &RDMAServerConfig{KeepAlive: -time.Second, MaxConns: 3, ACKTimeout: 9})
	require.NoError(t, err)
	require.Negative(t, s.keepAlive, "no probes")
	require.Equal(t, 3, s.maxConns)
	require.Equal(t, uint8(9), s.ackTO)
	require.NoError(t, s.Close())

	p, m, _ := r.srvDev.Engine().Memory().Counts()
	require.Equal(t, []int{pds, mrs}, []int{p, m}, "nothing left allocated")
}
