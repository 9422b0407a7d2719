package roce

import (
	"bytes"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// secondQP adds another RC QP (with its own CQs) to s's engine and PD.
func secondQP(t *testing.T, s *side) *side {
	t.Helper()
	scq, err := qp.NewCQ(64)
	require.NoError(t, err)
	rcq, err := qp.NewCQ(64)
	require.NoError(t, err)
	q, err := s.e.CreateQP(qp.Config{Type: qp.RC, PD: s.pd, SendCQ: scq, RecvCQ: rcq, Cap: sideCap})
	require.NoError(t, err)
	return &side{e: s.e, pd: s.pd, scq: scq, rcq: rcq, q: q, addr: s.addr}
}

// TestFlushPersistentDoesNotStallTheWorker: the msync of a 64 MiB FLUSH
// to persistence runs off the worker. While it is held (a gate in the
// engine's persist hook), another QP of the same worker completes a WRITE,
// and the FLUSH completes only once the msync returned. Ordering is by
// events: the hook reports that it started and waits for the gate.
func TestFlushPersistentDoesNotStallTheWorker(t *testing.T) {
	net := transport.NewMemNetwork()
	a1 := newSide(t, net, "10.9.0.1", qp.RC)
	baddr := netip.MustParseAddr("10.9.0.2")
	c, err := net.Listen(netip.AddrPortFrom(baddr, transport.RoCEv2Port))
	require.NoError(t, err)
	e, err := New(Config{Conn: c, Workers: 1}) // one worker: every QP of b shares it
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	pd, err := e.Memory().AllocPD()
	require.NoError(t, err)
	b1 := secondQP(t, &side{e: e, pd: pd, addr: baddr})
	b2 := secondQP(t, b1)
	a2 := secondQP(t, a1)

	const size = 64 << 20
	mp, err := mr.CreateMapFile(filepath.Join(t.TempDir(), "pmem"), size)
	require.NoError(t, err)
	t.Cleanup(func() { mp.Close() })
	for i := 0; i < size; i += 4096 {
		mp.Bytes()[i] = byte(i >> 12) // every page dirty
	}
	fm, err := e.Memory().RegMR(pd, mp.Bytes(), mr.LocalWrite|mr.RemoteWrite|mr.FlushGlobal|mr.FlushPersistent,
		mr.WithMapping(mp))
	require.NoError(t, err)
	t.Cleanup(func() { fm.Dereg() })

	started := make(chan int, 4)
	gate := make(chan struct{})
	persisted := make(chan error, 4)
	e.workers[0].persist = func(r *mr.Region) error {
		started <- r.Len()
		<-gate
		err := r.Persist()
		persisted <- err
		return err
	}

	// Timeout 20 (4.3 s per retry): the FLUSH's requester must not give
	// up while the test holds its msync.
	connect(t, a1, b1, qp.MTU4096, 20)
	connect(t, a2, b2, qp.MTU4096, 14)
	amr, abuf := regMR(t, a1, 4096)
	bmr, bbuf := regMR(t, b2, 4096)
	for i := range abuf {
		abuf[i] = byte(i*3 + 1)
	}

	_, err = a1.e.PostSend(a1.q, []qp.SendWR{{ID: 1, Opcode: qp.WRFlush, Flags: qp.Signaled,
		SGL:        []qp.SGE{{Addr: amr.IOVA(), Length: size, LKey: amr.LKey()}},
		RemoteAddr: fm.IOVA(), RKey: fm.RKey(), CompareAdd: wire.FlushPersistent}})
	require.NoError(t, err)
	select {
	case n := <-started:
		require.Equal(t, size, n, "the msync covers the FLUSH's 64 MiB")
	case <-time.After(10 * time.Second):
		t.Fatal("the FLUSH never reached its msync")
	}

	// The worker that runs b1 also runs b2: its WRITE completes while
	// b1's msync is still held.
	_, err = a2.e.PostSend(a2.q, []qp.SendWR{{ID: 2, Opcode: qp.WRRDMAWrite, Flags: qp.Signaled,
		SGL: []qp.SGE{{Addr: amr.IOVA(), Length: 4096, LKey: amr.LKey()}}, RemoteAddr: bmr.IOVA(), RKey: bmr.RKey()}})
	require.NoError(t, err)
	wc := waitWC(t, a2.scq)
	require.Equal(t, qp.WCSuccess, wc.Status)
	require.Equal(t, uint64(2), wc.ID)
	require.True(t, bytes.Equal(abuf, bbuf))
	var none [1]qp.WC
	require.Zero(t, a1.scq.Poll(none[:]), "the FLUSH is not acknowledged before its msync returned")

	close(gate)
	wc = waitWC(t, a1.scq)
	require.Equal(t, qp.WCSuccess, wc.Status)
	require.Equal(t, qp.WCFlush, wc.Opcode)
	require.NoError(t, <-persisted, "the msync itself succeeded")
	require.Empty(t, started, "one msync for the FLUSH (retransmits are answered, not executed)")
}
