package qp

import (
	"testing"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// flushMRWR is a FLUSH of selectivity level "memory region" (rxe's
// IB_FLUSH_MR): the whole region the rkey names, whatever the RETH's VA
// and length say.
func (l *persistLink) flushMRWR(id uint64, va uint64, n int, placement uint8) SendWR {
	wr := l.flushWR(id, 0, n, placement)
	wr.RemoteAddr, wr.Swap = va, wire.FlushMR
	return wr
}

// requireNAK checks that out is one NAK with code and that b is in ERR.
func requireNAK(t *testing.T, l *link, out [][]byte, code uint8) {
	t.Helper()
	require.Len(t, out, 1)
	var p wire.Packet
	require.NoError(t, p.Parse(out[0]))
	require.Equal(t, wire.RCAck, p.Opcode)
	require.Equal(t, wire.SynNAK, p.AETH.Syndrome().Kind())
	require.Equal(t, code, p.AETH.Syndrome().NAKCode())
	require.Equal(t, Err, l.b.q.State())
}

// Bug (found by the memory audit, session AF): the responder ignored the
// FETH's selectivity level. A FLUSH of a whole memory region (IB_FLUSH_MR)
// was taken for a range FLUSH of [VA, VA+length): with the length 0 a
// requester naturally sends it was ACKed at once, as a flush of nothing,
// without an msync, so "persisted" covered none of the bytes written; with
// a VA outside the region it was refused. rdma_rxe skips the range check
// for IB_FLUSH_MR (check_rkey) and flushes the whole region
// (process_flush); so does rxed now (mr.Table.LookupFlushQP).
func TestFlushOfTheWholeRegionPersistsIt(t *testing.T) {
	l := newPersistLink(t)
	l.post(l.flushMRWR(1, 0, 0, wire.FlushPersistent))
	req := l.a.env.take()
	l.toB(req...)
	require.Empty(t, l.env.take(), "the ACK waits for the msync")
	require.Len(t, l.env.started, 1, "an msync was started")
	require.Equal(t, l.fm.Len(), l.env.started[0].reg.Len(), "of the whole region")
	l.env.finish(t, l.link, 0, nil)
	require.Equal(t, []ackOf{{wire.RCAck, psns(req)[0], ackUnlimited}}, acks(t, l.env.take()))

	// The VA and length of a region FLUSH are not checked against it.
	m := newPersistLink(t)
	m.post(m.flushMRWR(1, m.fm.IOVA()+uint64(m.fm.Len()), 4096, wire.FlushGlobal))
	req = m.a.env.take()
	m.toB(req...)
	require.Equal(t, []ackOf{{wire.RCAck, psns(req)[0], ackUnlimited}}, acks(t, m.env.take()))
}

// Bug (found by the memory audit, session AF): a FLUSH of zero bytes was
// ACKed whatever its rkey: LookupQP answers any zero-length access with an
// empty Region without looking at the key, which C9-88 allows for READ
// and WRITE only. rdma_rxe checks a FLUSH's rkey, rights and VA whatever
// its length (check_rkey skips only zero-length READs and WRITEs) and
// answers a bad one with a remote access NAK (RESPST_ERR_RKEY_VIOLATION).
func TestZeroLengthFlushChecksTheRKey(t *testing.T) {
	for _, c := range []struct {
		name string
		wr   func(l *persistLink) SendWR
	}{
		{"stale rkey", func(l *persistLink) SendWR {
			wr := l.flushWR(1, 0, 0, wire.FlushGlobal)
			wr.RKey = mr.IncKey(wr.RKey)
			return wr
		}},
		{"region without FLUSH access", func(l *persistLink) SendWR {
			wr := l.flushWR(1, 0, 0, wire.FlushGlobal)
			wr.RemoteAddr, wr.RKey = l.b.m.IOVA(), l.b.m.RKey()
			return wr
		}},
		{"VA past the region's end", func(l *persistLink) SendWR {
			wr := l.flushWR(1, 0, 0, wire.FlushPersistent)
			wr.RemoteAddr = l.fm.IOVA() + uint64(l.fm.Len()) + 1
			return wr
		}},
		{"stale rkey, whole region", func(l *persistLink) SendWR {
			wr := l.flushMRWR(1, 0, 0, wire.FlushPersistent)
			wr.RKey = mr.IncKey(wr.RKey)
			return wr
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newPersistLink(t)
			l.post(c.wr(l))
			l.toB(l.a.env.take()...)
			requireNAK(t, l.link, l.env.take(), wire.NAKRemoteAccess)
			require.Empty(t, l.env.started)
		})
	}
	// The empty range at the region's end is in it (rxe mr_check_range).
	l := newPersistLink(t)
	wr := l.flushWR(1, 0, 0, wire.FlushPersistent)
	wr.RemoteAddr = l.fm.IOVA() + uint64(l.fm.Len())
	l.post(wr)
	req := l.a.env.take()
	l.toB(req...)
	require.Equal(t, []ackOf{{wire.RCAck, psns(req)[0], ackUnlimited}}, acks(t, l.env.take()))
}
