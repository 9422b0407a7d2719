// Package e2e holds cross-package tests: several rxed devices (pkg/ib over
// pkg/roce) talking over an in-memory network or loopback UDP.
package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// node is one device with a PD, a CQ pair and a buffer registered with
// every access right.
type node struct {
	t    testing.TB
	dev  *ib.Device
	pd   *ib.PD
	scq  *ib.CQ
	rcq  *ib.CQ
	buf  []byte
	mr   *ib.MR
	addr netip.Addr
}

type nodeOpts struct {
	bufSize int
	wrap    func(transport.Conn) (transport.Conn, error)
	cqe     int
}

func newMemNode(t testing.TB, net *transport.MemNetwork, addr string, o nodeOpts) *node {
	t.Helper()
	a := netip.MustParseAddr(addr)
	c, err := net.Listen(netip.AddrPortFrom(a, transport.RoCEv2Port))
	require.NoError(t, err)
	return newNode(t, ib.Config{Conn: c, Wrap: o.wrap, Workers: 2}, a, o)
}

func newNode(t testing.TB, cfg ib.Config, a netip.Addr, o nodeOpts) *node {
	t.Helper()
	if o.bufSize == 0 {
		o.bufSize = 1 << 20
	}
	if o.cqe == 0 {
		o.cqe = 4096
	}
	dev, err := ib.OpenDevice(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	n := &node{t: t, dev: dev, addr: a}
	n.pd, err = dev.AllocPD()
	require.NoError(t, err)
	n.scq, err = dev.CreateCQ(o.cqe)
	require.NoError(t, err)
	n.rcq, err = dev.CreateCQ(o.cqe)
	require.NoError(t, err)
	n.buf = make([]byte, o.bufSize)
	n.mr, err = n.pd.RegMR(n.buf, ib.AccessLocalWrite|ib.AccessRemoteWrite|ib.AccessRemoteRead|ib.AccessRemoteAtomic)
	require.NoError(t, err)
	return n
}

type qpOpts struct {
	typ         ib.QPType
	mtu         ib.MTU
	timeout     uint8
	retry       uint8
	rnrRetry    uint8
	minRNR      uint8
	access      ib.Access
	srq         *ib.SRQ
	maxRdAtomic uint8
	sendWR      uint32
	noAccess    bool
}

func (o *qpOpts) defaults() {
	if o.typ == 0 {
		o.typ = ib.RC
	}
	if o.mtu == 0 {
		o.mtu = ib.MTU1024
	}
	if o.timeout == 0 {
		o.timeout = 14 // 67 ms, perftest's default
	}
	if o.retry == 0 {
		o.retry = 7
	}
	if o.minRNR == 0 {
		o.minRNR = 1 // 10 us
	}
	if o.access == 0 && !o.noAccess {
		o.access = ib.AccessRemoteWrite | ib.AccessRemoteRead | ib.AccessRemoteAtomic
	}
	if o.maxRdAtomic == 0 {
		o.maxRdAtomic = 16
	}
	if o.sendWR == 0 {
		o.sendWR = 1024
	}
}

func (n *node) createQP(o qpOpts) *ib.QP {
	n.t.Helper()
	o.defaults()
	c := ib.QPCap{MaxSendWR: o.sendWR, MaxRecvWR: 1024, MaxSendSGE: 8, MaxRecvSGE: 8, MaxInlineData: 256}
	if o.srq != nil {
		c.MaxRecvWR = 0
	}
	q, err := n.pd.CreateQP(ib.QPInitAttr{Type: o.typ, SendCQ: n.scq, RecvCQ: n.rcq, SRQ: o.srq, Cap: c})
	require.NoError(n.t, err)
	return q
}

// connectQPs brings a (on na) and b (on nb) to RTS towards each other.
func connectQPs(t testing.TB, na *node, a *ib.QP, nb *node, b *ib.QP, o qpOpts) {
	t.Helper()
	o.defaults()
	for _, s := range []struct {
		n    *node
		q    *ib.QP
		peer *node
		pq   *ib.QP
	}{{na, a, nb, b}, {nb, b, na, a}} {
		switch o.typ {
		case ib.UD:
			require.NoError(t, s.q.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, QKey: 0x11111111},
				ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrQKey))
			require.NoError(t, s.q.Modify(&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState))
			require.NoError(t, s.q.Modify(&ib.QPAttr{State: ib.QPSRTS, SQPSN: 7}, ib.AttrState|ib.AttrSQPSN))
			continue
		}
		require.NoError(t, s.q.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, AccessFlags: o.access},
			ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags))
		mask := ib.AttrState | ib.AttrAV | ib.AttrPathMTU | ib.AttrDestQPN | ib.AttrRQPSN
		if o.typ == ib.RC {
			mask |= ib.AttrMaxDestRdAtomic | ib.AttrMinRNRTimer
		}
		require.NoError(t, s.q.Modify(&ib.QPAttr{State: ib.QPSRTR, PathMTU: o.mtu, DestQPN: s.pq.Num(), RQPSN: 0xFFFFF0,
			MaxDestRdAtomic: 16, MinRNRTimer: o.minRNR,
			AV: ib.AddrVector{DGID: s.peer.addr, DestPort: s.peer.dev.UDPPort(), PortNum: 1}}, mask))
		mask = ib.AttrState | ib.AttrSQPSN
		if o.typ == ib.RC {
			mask |= ib.AttrTimeout | ib.AttrRetryCnt | ib.AttrRNRRetry | ib.AttrMaxQPRdAtomic
		}
		// PSNs start just below the 24-bit wrap so every test crosses it.
		require.NoError(t, s.q.Modify(&ib.QPAttr{State: ib.QPSRTS, SQPSN: 0xFFFFF0, Timeout: o.timeout,
			RetryCnt: o.retry, RNRRetry: o.rnrRetry, MaxRdAtomic: o.maxRdAtomic}, mask))
	}
}

// pair creates two memory-network nodes with one connected QP each.
func pair(t testing.TB, o qpOpts) (*node, *ib.QP, *node, *ib.QP) {
	t.Helper()
	net := transport.NewMemNetwork()
	na := newMemNode(t, net, "10.1.0.1", nodeOpts{})
	nb := newMemNode(t, net, "10.1.0.2", nodeOpts{})
	a, b := na.createQP(o), nb.createQP(o)
	connectQPs(t, na, a, nb, b, o)
	return na, a, nb, b
}

// wait returns the next completion on cq or fails the test after d.
func wait(t testing.TB, cq *ib.CQ, d time.Duration) ib.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wc [1]ib.WC
	n, err := cq.WaitPoll(ctx, wc[:])
	require.NoError(t, err, "no completion within %v", d)
	require.Equal(t, 1, n)
	return wc[0]
}

// waitOK waits for a successful completion of id.
func waitOK(t testing.TB, cq *ib.CQ, id uint64, op ib.WCOpcode) ib.WC {
	t.Helper()
	wc := wait(t, cq, 20*time.Second)
	require.Equal(t, ib.WCSuccess.String(), wc.Status.String(), "wr %d", wc.ID)
	require.Equal(t, id, wc.ID)
	require.Equal(t, op.String(), wc.Opcode.String())
	return wc
}

// noCompletion asserts that cq stays empty.
func noCompletion(t testing.TB, cq *ib.CQ) {
	t.Helper()
	var wc [1]ib.WC
	require.Equal(t, 0, cq.Poll(wc[:]), "unexpected completion %v", fmt.Sprint(wc[0]))
}

func sge(n *node, off, length int) ib.SGE {
	return ib.SGE{Addr: n.mr.IOVA() + uint64(off), Length: uint32(length), LKey: n.mr.LKey()}
}

func fill(b []byte, seed int) {
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
}

func newMemNet() *transport.MemNetwork { return transport.NewMemNetwork() }
