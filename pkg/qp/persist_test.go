package qp

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// The pending-FLUSH state of the responder, driven by hand: the Env below
// records each StartPersist and the test decides when the msync "returns"
// by calling PersistDone, so no goroutine is involved.

// persistEnv is a capEnv that runs no msync itself.
type persistEnv struct {
	*capEnv
	started []startedPersist
}

type startedPersist struct {
	q   *QP
	reg mr.Region
	t   PersistToken
}

func (e *persistEnv) StartPersist(q *QP, reg mr.Region, t PersistToken) {
	e.started = append(e.started, startedPersist{q: q, reg: reg, t: t})
}

// finish plays the msync's return: Persist for real, release, PersistDone
// and the Run the engine does after it.
func (e *persistEnv) finish(t *testing.T, l *link, i int, err error) {
	t.Helper()
	s := &e.started[i]
	if err == nil {
		require.NoError(t, s.reg.Persist())
	}
	s.reg.Release()
	s.q.PersistDone(e, s.t, err)
	s.q.Run(e, l.now, 1000)
}

// persistLink is a link whose b side registers a region over a file
// mapping with FLUSH_PERSISTENT and answers through a persistEnv.
type persistLink struct {
	*link
	env *persistEnv
	fm  *mr.MR // b's file-backed region
	mp  *mr.Mapping
}

func newPersistLink(t *testing.T) *persistLink {
	l := newLink(t, RC, 7, 7)
	mp, err := mr.CreateMapFile(filepath.Join(t.TempDir(), "pmem"), 1<<16)
	require.NoError(t, err)
	fm, err := l.b.mem.RegMR(l.b.pd, mp.Bytes(), mr.LocalWrite|mr.RemoteWrite|mr.RemoteRead|
		mr.RemoteAtomic|mr.FlushGlobal|mr.FlushPersistent, mr.WithMapping(mp))
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, fm.Dereg())
		require.NoError(t, mp.Close(), "every region reference was released")
	})
	return &persistLink{link: l, env: &persistEnv{capEnv: l.b.env}, fm: fm, mp: mp}
}

// toB delivers a's packets to b through the persistEnv and reports
// whether b's Run asked for another round.
func (l *persistLink) toB(pkts ...[]byte) (more bool) {
	for _, raw := range pkts {
		var p wire.Packet
		require.NoError(l.t, p.Parse(raw))
		ri := RecvInfo{Src: l.a.addr, Dst: l.b.addr}
		require.Equal(l.t, DropNone, l.b.q.Check(&p, &ri, l.b.addr.Addr()))
		l.b.q.Receive(l.env, &p, &ri, l.now)
		more = l.b.q.Run(l.env, l.now, 1000)
	}
	return more
}

func (l *persistLink) flushWR(id uint64, off, n int, placement uint8) SendWR {
	return SendWR{ID: id, Opcode: WRFlush, Flags: Signaled, SGL: []SGE{l.a.sge(0, n)},
		RemoteAddr: l.fm.IOVA() + uint64(off), RKey: l.fm.RKey(), CompareAdd: uint64(placement)}
}

// ackOf describes a response: its opcode, PSN and AETH syndrome kind.
type ackOf struct {
	op  wire.Opcode
	psn PSN
	syn wire.Syndrome
}

func acks(t *testing.T, pkts [][]byte) []ackOf {
	t.Helper()
	var out []ackOf
	for _, raw := range pkts {
		var p wire.Packet
		require.NoError(t, p.Parse(raw))
		out = append(out, ackOf{op: p.Opcode, psn: PSN(p.BTH.PSN()), syn: p.AETH.Syndrome()})
	}
	return out
}

func TestFlushPersistentAckWaitsForPersist(t *testing.T) {
	l := newPersistLink(t)
	binary.NativeEndian.PutUint64(l.a.buf[512:], 5)
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 70, SGL: []SGE{l.b.sge(0, 64)}}))
	l.post(
		SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 200)},
			RemoteAddr: l.fm.IOVA(), RKey: l.fm.RKey()},
		l.flushWR(2, 0, 200, wire.FlushPersistent),
		SendWR{ID: 3, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 8)}},
		SendWR{ID: 4, Opcode: WRAtomicFetchAndAdd, Flags: Signaled, SGL: []SGE{l.a.sge(520, 8)},
			RemoteAddr: l.fm.IOVA() + 1024, RKey: l.fm.RKey(), CompareAdd: 7},
	)
	req := l.a.env.take()
	require.Len(t, req, 4)
	for i := range l.a.buf[:200] {
		l.a.buf[i] = byte(i)
	}

	l.toB(req[0])
	require.Equal(t, []ackOf{{wire.RCAck, psns(req)[0], ackUnlimited}}, acks(t, l.env.take()),
		"the WRITE before the FLUSH is acknowledged as usual")

	more := l.toB(req[1:]...)
	require.False(t, more, "a QP waiting for an msync asks for no more rounds (the worker must not spin)")
	require.Empty(t, l.env.take(), "no ACK, and none that would imply it, while the msync runs")
	require.Len(t, l.env.started, 1, "one msync, handed to the Env")
	require.Equal(t, 200, l.env.started[0].reg.Len(), "over the FLUSH's bytes")
	require.Empty(t, poll(t, l.b.rcq), "the SEND behind the FLUSH waits")
	require.Zero(t, binary.NativeEndian.Uint64(l.mp.Bytes()[1024:]), "and so does the atomic")
	require.True(t, l.b.q.resp.persisting())

	// The requester's timer does not care: a retransmitted FLUSH waits too.
	l.toB(req[1])
	require.Empty(t, l.env.take())

	l.env.finish(t, l.link, 0, nil)
	resp := l.env.take()
	want := []ackOf{
		{wire.RCAck, psns(req)[1], ackUnlimited},       // the FLUSH, now durable
		{wire.RCAck, psns(req)[2], ackUnlimited},       // the SEND
		{wire.RCAtomicAck, psns(req)[3], ackUnlimited}, // the atomic
		{wire.RCAck, psns(req)[1], ackUnlimited},       // the duplicate FLUSH, answered again
	}
	require.Equal(t, want, acks(t, resp), "in PSN order, after the msync returned")
	require.Len(t, poll(t, l.b.rcq), 1)
	require.Equal(t, uint64(7), binary.NativeEndian.Uint64(l.mp.Bytes()[1024:]))
	require.Len(t, l.env.started, 1, "the duplicate FLUSH is answered, not executed again")
	require.False(t, l.b.q.resp.persisting())

	l.deliver(l.a, l.b, resp...)
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, 4)
	for i, wc := range wcs {
		require.Equal(t, uint64(i+1), wc.ID)
		require.Equal(t, WCSuccess, wc.Status, "wr %d", wc.ID)
	}
	require.Equal(t, WCFlush, wcs[1].Opcode)
}

// TestFlushPersistentOverflowAsksAgain: a full-MTU WRITE behind a pending
// FLUSH cannot wait in the held queue; it and everything after it are
// dropped, and once the FLUSH is acknowledged a sequence NAK sends the
// requester back to the PSN after it, so nothing waits for a timer.
func TestFlushPersistentOverflowAsksAgain(t *testing.T) {
	l := newPersistLink(t)
	for i := range l.a.buf[:256] {
		l.a.buf[i] = byte(i ^ 0x5A)
	}
	l.post(
		l.flushWR(1, 0, 4096, wire.FlushPersistent),
		SendWR{ID: 2, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 256)},
			RemoteAddr: l.fm.IOVA() + 8192, RKey: l.fm.RKey()},
		SendWR{ID: 3, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 4)},
			RemoteAddr: l.fm.IOVA() + 9000, RKey: l.fm.RKey()},
	)
	req := l.a.env.take()
	require.Len(t, req, 3)
	require.Greater(t, len(req[1]), heldRequestLen, "the 256-byte WRITE cannot be held")
	require.LessOrEqual(t, len(req[2]), heldRequestLen, "the 4-byte one could, but follows a dropped one")
	l.toB(req...)
	require.Empty(t, l.env.take())

	l.env.finish(t, l.link, 0, nil)
	resp := l.env.take()
	require.Equal(t, []ackOf{
		{wire.RCAck, psns(req)[0], ackUnlimited},
		{wire.RCAck, psns(req)[1], wire.NAKSyndrome(wire.NAKPSNSeqErr)},
	}, acks(t, resp), "the FLUSH's ACK, then a NAK naming the first PSN after it")
	require.Zero(t, l.mp.Bytes()[8192+1], "the dropped WRITE was not placed")

	l.deliver(l.a, l.b, resp...)
	again := l.a.env.take()
	require.Equal(t, psns(req[1:]), psns(again), "the requester resends from the NAKed PSN")
	l.toB(again...)
	l.deliver(l.a, l.b, l.env.take()...)
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, 3)
	for i, wc := range wcs {
		require.Equal(t, uint64(i+1), wc.ID)
		require.Equal(t, WCSuccess, wc.Status, "wr %d", wc.ID)
	}
	require.Equal(t, l.a.buf[:256], l.mp.Bytes()[8192:8192+256])
	require.Len(t, l.env.started, 1)
}

// TestFlushPersistentFailureIsRemoteAccessError: an msync that fails is
// rxe's rkey violation for the FLUSH (a failed rxe_flush_pmem_iova): NAK,
// both sides in ERR, the FLUSH completes with REM_ACCESS_ERR.
func TestFlushPersistentFailureIsRemoteAccessError(t *testing.T) {
	l := newPersistLink(t)
	l.post(l.flushWR(1, 0, 100, wire.FlushPersistent))
	l.toB(l.a.env.take()...)
	require.Empty(t, l.env.take())
	l.env.finish(t, l.link, 0, errors.New("msync: EIO"))
	resp := l.env.take()
	require.Equal(t, []ackOf{{wire.RCAck, 0xFFFFFE, wire.NAKSyndrome(wire.NAKRemoteAccess)}}, acks(t, resp))
	require.Equal(t, Err, l.b.q.State())
	l.deliver(l.a, l.b, resp...)
	wcs := poll(t, l.a.scq)
	require.NotEmpty(t, wcs)
	require.Equal(t, WCRemAccessErr, wcs[0].Status)
}

// TestFlushPersistentStaleCompletion: a QP moved to ERR or RESET while its
// msync runs sends nothing when the msync returns, and the completion of
// a FLUSH from before a reset cannot complete a later one.
func TestFlushPersistentStaleCompletion(t *testing.T) {
	l := newPersistLink(t)
	l.post(l.flushWR(1, 0, 100, wire.FlushPersistent))
	l.toB(l.a.env.take()...)
	require.NoError(t, l.b.q.Modify(&Attr{State: Err}, AttrState, l.now))
	l.b.env.take()
	l.env.finish(t, l.link, 0, nil)
	require.Empty(t, l.env.take(), "a QP in ERR acknowledges nothing")
	require.False(t, l.b.q.resp.persisting())

	// Reset while pending: the responder forgets the FLUSH. Reconnected,
	// the same request executes anew; the old msync's return completes
	// nothing, the new one's sends the ACK.
	m := newPersistLink(t)
	m.post(m.flushWR(1, 0, 100, wire.FlushPersistent))
	req := m.a.env.take()
	m.toB(req...)
	require.NoError(t, m.b.q.Modify(&Attr{State: Reset}, AttrState, m.now))
	require.False(t, m.b.q.resp.persisting())
	require.NoError(t, m.b.q.Modify(&Attr{State: Init, PortNum: 1, AccessFlags: AccessRemoteWrite},
		m.initMask(RC), m.now))
	require.NoError(t, m.b.q.Modify(&Attr{State: RTR, AV: AddrVector{DGID: m.a.addr.Addr()}, PathMTU: MTU256,
		DestQPN: m.a.q.Num(), RQPSN: psns(req)[0], MaxDestRdAtomic: 4, MinRNRTimer: 3},
		AttrState|AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRdAtomic|AttrMinRNRTimer, m.now))
	m.toB(req...)
	require.Len(t, m.env.started, 2)
	require.NotEqual(t, m.env.started[0].t, m.env.started[1].t)
	m.env.finish(t, m.link, 0, nil)
	require.Empty(t, m.env.take(), "the msync from before the reset completes nothing")
	require.True(t, m.b.q.resp.persisting())
	m.env.finish(t, m.link, 1, nil)
	require.Equal(t, []ackOf{{wire.RCAck, psns(req)[0], ackUnlimited}}, acks(t, m.env.take()))
}

// TestFlushImmediateCases: FLUSH to global visibility and a zero-length
// FLUSH to persistence are answered at once, without an msync; and an
// Env that cannot persist elsewhere runs the msync inline, ACK after it.
func TestFlushImmediateCases(t *testing.T) {
	l := newPersistLink(t)
	l.post(l.flushWR(1, 0, 4096, wire.FlushGlobal), l.flushWR(2, 0, 0, wire.FlushPersistent))
	req := l.a.env.take()
	l.toB(req...)
	require.Equal(t, []ackOf{{wire.RCAck, psns(req)[0], ackUnlimited}, {wire.RCAck, psns(req)[1], ackUnlimited}},
		acks(t, l.env.take()))
	require.Empty(t, l.env.started)

	m := newPersistLink(t)
	m.post(m.flushWR(1, 0, 4096, wire.FlushPersistent))
	req = m.a.env.take()
	m.deliver(m.b, m.a, req...) // through the plain capEnv
	require.Equal(t, []ackOf{{wire.RCAck, psns(req)[0], ackUnlimited}}, acks(t, m.b.env.take()))
	require.False(t, m.b.q.resp.persisting())
}
