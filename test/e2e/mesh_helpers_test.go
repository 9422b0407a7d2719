package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// meshNode is one engine of TestMesh: a node whose buffer is carved into
// regions by a bump allocator, plus a second region over the same buffer
// that may bind windows.
type meshNode struct {
	*node
	idx   int
	xmr   *ib.MR // LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | MW_BIND | FLUSH_GLOBAL
	alloc int
}

// take reserves n bytes (64-byte aligned, so atomics are aligned) and
// returns their offset in the node's buffer.
func (m *meshNode) take(n int) int {
	m.t.Helper()
	off := m.alloc
	m.alloc += (n + 63) &^ 63
	require.LessOrEqual(m.t, m.alloc, len(m.buf), "mesh node %d: buffer too small", m.idx)
	return off
}

// openMeshNodes opens n engines: in memory (udp false) or each on its own
// loopback address 127.0.1.1 … 127.0.1.n (reserved for this test), on
// port 4791 when it is free and on an ephemeral port otherwise (peers
// then use AddrVector.DestPort).
func openMeshNodes(t *testing.T, n int, udp bool, bufSize func(i int) int, tally *opcodeTally) []*meshNode {
	t.Helper()
	var memNet *transport.MemNetwork
	if !udp {
		memNet = transport.NewMemNetwork()
		memNet.QueueLen = 1 << 16 // UC and UD do not recover from queue drops
	}
	nodes := make([]*meshNode, n)
	for i := range nodes {
		wrap := func(c transport.Conn) (transport.Conn, error) { return countingConn{c, tally}, nil }
		o := nodeOpts{bufSize: bufSize(i), cqe: 64, wrap: wrap}
		var nd *node
		if udp {
			a := netip.MustParseAddr(fmt.Sprintf("127.0.1.%d", i+1))
			cfg := ib.Config{Addrs: []netip.Addr{a}, Workers: 2, Wrap: wrap}
			if probe, err := ib.OpenDevice(cfg); err != nil {
				cfg.EphemeralPort = true
			} else {
				require.NoError(t, probe.Close())
			}
			nd = newNode(t, cfg, a, o)
		} else {
			nd = newMemNode(t, memNet, fmt.Sprintf("10.77.0.%d", i+1), o)
		}
		m := &meshNode{node: nd, idx: i}
		var err error
		m.xmr, err = nd.pd.RegMR(nd.buf, ib.AccessLocalWrite|ib.AccessRemoteWrite|ib.AccessRemoteRead|ib.AccessMWBind|ib.AccessFlushGlobal)
		require.NoError(t, err)
		nodes[i] = m
	}
	return nodes
}

// meshQP is a QP with completion queues of its own, so the goroutine
// driving one pair never sees another pair's completions.
type meshQP struct {
	n   *meshNode
	qp  *ib.QP
	scq *ib.CQ
	rcq *ib.CQ
}

func (m *meshNode) createMeshQP(typ ib.QPType, srq *ib.SRQ) *meshQP {
	m.t.Helper()
	scq, err := m.dev.CreateCQ(256)
	require.NoError(m.t, err)
	rcq, err := m.dev.CreateCQ(1024)
	require.NoError(m.t, err)
	c := ib.QPCap{MaxSendWR: 256, MaxRecvWR: 1024, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 256}
	if srq != nil {
		c.MaxRecvWR = 0
	}
	q, err := m.pd.CreateQP(ib.QPInitAttr{Type: typ, SendCQ: scq, RecvCQ: rcq, SRQ: srq, Cap: c})
	require.NoError(m.t, err)
	return &meshQP{n: m, qp: q, scq: scq, rcq: rcq}
}

// meshWait returns the next completion on cq; the pair goroutines use it
// instead of wait because they must not call t.FailNow.
func meshWait(ctx context.Context, cq *ib.CQ) (ib.WC, error) {
	var wc [1]ib.WC
	n, err := cq.WaitPoll(ctx, wc[:])
	if err != nil {
		return ib.WC{}, fmt.Errorf("no completion: %w", err)
	}
	if n != 1 {
		return ib.WC{}, fmt.Errorf("WaitPoll returned %d completions", n)
	}
	return wc[0], nil
}

// anyID makes meshExpect accept a completion of any wr_id.
const anyID = ^uint64(0)

// meshExpect waits for a successful completion of id (or anyID) with
// opcode op.
func meshExpect(ctx context.Context, cq *ib.CQ, id uint64, op ib.WCOpcode) (ib.WC, error) {
	wc, err := meshWait(ctx, cq)
	if err != nil {
		return wc, fmt.Errorf("waiting for wr %d (%v): %w", id, op, err)
	}
	if wc.Status != ib.WCSuccess {
		return wc, fmt.Errorf("wr %d: status %v (want SUCCESS for wr %d %v)", wc.ID, wc.Status, id, op)
	}
	if (id != anyID && wc.ID != id) || wc.Opcode != op {
		return wc, fmt.Errorf("completion wr %d %v, want wr %d %v", wc.ID, wc.Opcode, id, op)
	}
	return wc, nil
}

// sameBytes reports the first difference between got and want.
func sameBytes(what string, got, want []byte) error {
	if bytes.Equal(got, want) {
		return nil
	}
	if len(got) != len(want) {
		return fmt.Errorf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("%s: byte %d of %d is %#x, want %#x", what, i, len(got), got[i], want[i])
		}
	}
	return nil
}

// splitSGL gathers size bytes at off in three SGEs of uneven length with
// gaps between them (one SGE below 3 bytes, none for 0), and returns the
// bytes the gather produces.
func (m *meshNode) splitSGL(off, size int) ([]ib.SGE, []byte) {
	if size == 0 {
		return nil, nil
	}
	if size < 3 {
		return []ib.SGE{sge(m.node, off, size)}, append([]byte(nil), m.buf[off:off+size]...)
	}
	a, b := size/5+1, size/3
	lens := []int{a, b, size - a - b}
	var sgl []ib.SGE
	var want []byte
	p := off
	for _, l := range lens {
		sgl = append(sgl, sge(m.node, p, l))
		want = append(want, m.buf[p:p+l]...)
		p += l + 8 // an 8-byte gap the gather must skip
	}
	return sgl, want
}

// opcodeTally counts the BTH opcodes of every datagram the engines send.
type opcodeTally [256]atomic.Uint64

// countingConn wraps an engine's transport and tallies what it sends.
type countingConn struct {
	transport.Conn
	tally *opcodeTally
}

func (c countingConn) Send(bufs [][]byte, ep transport.Endpoint) error {
	for _, b := range bufs {
		if len(b) > 0 {
			c.tally[b[0]].Add(1)
		}
	}
	return c.Conn.Send(bufs, ep)
}

// meshOpcodes are the opcodes TestMesh must put on the wire: every RC,
// UC and UD opcode rxe sends except RESYNC.
func meshOpcodes() []wire.Opcode {
	var ops []wire.Opcode
	for op := wire.RCSendFirst; op <= wire.RCFetchAdd; op++ {
		ops = append(ops, op)
	}
	ops = append(ops, wire.RCSendLastInv, wire.RCSendOnlyInv, wire.RCFlush, wire.RCAtomicWrite)
	for op := wire.UCSendFirst; op <= wire.UCWriteOnlyImm; op++ {
		ops = append(ops, op)
	}
	return append(ops, wire.UDSendOnly, wire.UDSendOnlyImm)
}
