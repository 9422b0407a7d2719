package qp

import (
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// SQD (send queue drain), driven by hand like protocol_test.go: the test
// decides which packets reach the peer and when, so "still draining" and
// "drained" are exact points, not races.

// drainWatch counts SQ-drained events of one QP and records, for each,
// how many completions its send CQ held when it fired.
type drainWatch struct {
	events  int
	cqAtEvt []int
}

// watchDrain installs the hook the engine installs through
// Config.OnSQDrained.
func watchDrain(t *testing.T, e *end) *drainWatch {
	w := &drainWatch{}
	e.q.onDrained = func(q *QP) {
		require.Same(t, e.q, q)
		w.events++
		w.cqAtEvt = append(w.cqAtEvt, e.scq.Len())
	}
	return w
}

const sqdNotify = AttrState | AttrEnSQDAsyncNotify

// toSQD moves e's QP to SQD, asking for the drained event or not.
func toSQD(t *testing.T, l *link, e *end, notify bool) {
	mask := AttrState
	if notify {
		mask = sqdNotify
	}
	require.NoError(t, e.q.Modify(&Attr{State: SQD, EnSQDAsyncNotify: notify}, mask, l.now))
	require.Equal(t, SQD, e.q.State())
}

func draining(e *end) bool { return e.q.Attr().SQDraining }

// writeThenSQD is an RC link whose requester has sent one signaled
// 16-byte WRITE (the packets returned, not yet delivered) and then moved
// to SQD, asking for the drained event or not; w watches the drain.
func writeThenSQD(t *testing.T, notify bool) (l *link, w *drainWatch, req [][]byte) {
	t.Helper()
	l = newLink(t, RC, 7, 7)
	w = watchDrain(t, l.a)
	l.post(SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 16)},
		RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()})
	req = l.a.env.take()
	toSQD(t, l, l.a, notify)
	return l, w, req
}

// An RC QP with a SEND, a READ and a multi-packet WRITE in flight (the
// WRITE cut off in mid-message by the budget) moves to SQD: the WRITE is
// finished, nothing new starts, sq_draining holds until the last
// response, the event fires exactly once right after it (with every
// completion already in the CQ), and the WRs posted before and during SQD
// go out only after SQD->RTS.
func TestSQDRCDrainsStartedWQEsThenResumesOnRTS(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	w := watchDrain(t, l.a)
	for i := range 3 {
		require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: uint64(100 + i), SGL: []SGE{l.b.sge(i*256, 256)}}))
	}
	copy(l.b.buf[8192:], "remote bytes to read")
	wrs := []SendWR{
		{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 100)}},
		{ID: 2, Opcode: WRRDMARead, Flags: Signaled, SGL: []SGE{l.a.sge(4096, 20)},
			RemoteAddr: l.b.m.IOVA() + 8192, RKey: l.b.m.RKey()},
		{ID: 3, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 700)}, // 3 packets at MTU 256
			RemoteAddr: l.b.m.IOVA() + 16384, RKey: l.b.m.RKey()},
		{ID: 4, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 10)}}, // posted, not started
	}
	for i := range wrs {
		require.NoError(t, l.a.q.PostSend(&wrs[i]))
	}
	l.a.q.Run(l.a.env, l.now, 3) // SEND, READ request, WRITE FIRST
	sent := l.a.env.take()
	require.Equal(t, []wire.Opcode{wire.RCSendOnly, wire.RCReadRequest, wire.RCWriteFirst}, opcodes(sent))

	toSQD(t, l, l.a, true)
	require.True(t, draining(l.a))
	require.Zero(t, w.events)
	l.a.q.Run(l.a.env, l.now, 1000)
	rest := l.a.env.take()
	require.Equal(t, []wire.Opcode{wire.RCWriteMiddle, wire.RCWriteLast}, opcodes(rest),
		"the WRITE in mid-message is finished; WR 4 does not start")
	sent = append(sent, rest...)

	// Posting in SQD is allowed (rxe_post_send refuses only below RTS);
	// the WR waits.
	require.NoError(t, l.a.q.PostSend(&SendWR{ID: 5, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 20)}}))
	l.a.q.Run(l.a.env, l.now, 1000)
	require.Empty(t, l.a.env.take(), "nothing new starts in SQD")

	// Leaving SQD before the drain ends is refused (only ERR may), and
	// changes nothing.
	err := l.a.q.Modify(&Attr{State: RTS}, AttrState, l.now)
	require.ErrorIs(t, err, ErrSQDraining)
	var me *ModifyError
	require.ErrorAs(t, err, &me)
	require.Equal(t, AttrState, me.Attr)
	require.Contains(t, err.Error(), "SQD->RTS")
	require.Equal(t, SQD, l.a.q.State())
	require.True(t, draining(l.a))

	l.deliver(l.b, l.a, sent...)
	resp := l.b.env.take()
	require.Equal(t, []wire.Opcode{wire.RCAck, wire.RCReadResponseOnly, wire.RCAck}, opcodes(resp))
	for i, p := range resp {
		require.True(t, draining(l.a), "response %d of %d: still draining", i, len(resp))
		require.Zero(t, w.events)
		l.deliver(l.a, l.b, p)
	}
	require.False(t, draining(l.a))
	require.Equal(t, 1, w.events, "one event, after the last response")
	require.Equal(t, []int{3}, w.cqAtEvt, "the drained WRs' completions precede the event")
	got := poll(t, l.a.scq)
	require.Len(t, got, 3)
	for i, wc := range got {
		require.Equal(t, uint64(i+1), wc.ID)
		require.Equal(t, WCSuccess, wc.Status)
	}
	require.Equal(t, "remote bytes to read", string(l.a.buf[4096:4096+20]))

	// Drained, still in SQD: nothing moves, no second event.
	l.a.q.Run(l.a.env, l.now, 1000)
	require.Empty(t, l.a.env.take())
	require.Equal(t, 1, w.events)

	require.NoError(t, l.a.q.Modify(&Attr{State: RTS}, AttrState, l.now))
	require.False(t, draining(l.a))
	l.a.q.Run(l.a.env, l.now, 1000)
	resumed := l.a.env.take()
	require.Equal(t, []wire.Opcode{wire.RCSendOnly, wire.RCSendOnly}, opcodes(resumed), "WRs 4 and 5")
	last := PSN(wire.BTH(sent[len(sent)-1]).PSN())
	require.Equal(t, []PSN{last.Next(), last.Add(2)}, psns(resumed), "the PSNs continue")
	l.deliver(l.b, l.a, resumed...)
	l.deliver(l.a, l.b, l.b.env.take()...)
	got = poll(t, l.a.scq)
	require.Len(t, got, 2)
	require.Equal(t, []uint64{4, 5}, []uint64{got[0].ID, got[1].ID})
	require.Equal(t, 1, w.events, "RTS traffic raises no drained event")
	rwc := poll(t, l.b.rcq)
	require.Len(t, rwc, 3)
	require.Equal(t, []uint32{100, 10, 20}, []uint32{rwc[0].ByteLen, rwc[1].ByteLen, rwc[2].ByteLen})
}

// Requests lost during the drain are retransmitted: go-back-N rewinds the
// requester onto WQEs that look unstarted (the second one has sent == 0
// again), and SQD must still resend them or the drain never ends. A WR
// behind them that never started stays put.
func TestSQDDrainRetransmitsLostRequests(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	w := watchDrain(t, l.a)
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 100, SGL: []SGE{l.b.sge(0, 256)}}))
	l.post(
		SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 16)},
			RemoteAddr: l.b.m.IOVA() + 4096, RKey: l.b.m.RKey()},
		SendWR{ID: 2, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 16)}},
	)
	lost := l.a.env.take()
	require.Len(t, lost, 2)
	require.NoError(t, l.a.q.PostSend(&SendWR{ID: 3, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 8)}}))
	toSQD(t, l, l.a, true)
	l.a.q.Run(l.a.env, l.now, 1000)
	require.Empty(t, l.a.env.take())

	l.now = l.a.q.Deadline()
	require.False(t, l.now.IsZero(), "the retransmit timer is armed")
	l.a.q.OnTimer(l.a.env, l.now, 1000)
	again := l.a.env.take()
	require.Equal(t, psns(lost), psns(again), "both lost requests are resent, WR 3 is not")
	require.True(t, draining(l.a))
	l.deliver(l.b, l.a, again...)
	acks := l.b.env.take()
	require.Len(t, acks, 2)
	l.deliver(l.a, l.b, acks[0])
	require.True(t, draining(l.a))
	require.Zero(t, w.events)
	l.deliver(l.a, l.b, acks[1])
	require.False(t, draining(l.a))
	require.Equal(t, 1, w.events)
	require.Len(t, poll(t, l.a.scq), 2)
	require.Equal(t, 1, l.a.q.SendQueueLen(), "WR 3 waits for RTS")
	require.True(t, l.a.q.Deadline().IsZero(), "nothing outstanding, no timer")
}

// Without en_sqd_async_notify the drain is the same (sq_draining, the
// refusal to leave early) but no event is raised.
func TestSQDWithoutNotifyRaisesNoEvent(t *testing.T) {
	l, w, req := writeThenSQD(t, false)
	require.True(t, draining(l.a))
	require.ErrorIs(t, l.a.q.Modify(&Attr{State: SQD}, AttrState, l.now), ErrSQDraining, "SQD->SQD waits too")
	l.deliver(l.b, l.a, req...)
	l.deliver(l.a, l.b, l.b.env.take()...)
	require.False(t, draining(l.a))
	require.Zero(t, w.events)
	require.Len(t, poll(t, l.a.scq), 1)
	require.NoError(t, l.a.q.Modify(&Attr{State: RTS}, AttrState, l.now))
}

// A QP with nothing started is drained at the moment of the transition:
// the event fires from Modify itself (rxe schedules its requester, which
// finds the queue drained and raises it straight away). WRs posted but
// not started do not hold the drain. Each later move into SQD (SQD->SQD
// included, as rxe_qp_sqd re-arms sq_draining) drains again.
func TestSQDAlreadyDrainedFiresAtOnce(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	w := watchDrain(t, l.a)
	require.NoError(t, l.a.q.PostSend(&SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 8)}}))
	toSQD(t, l, l.a, true)
	require.Equal(t, 1, w.events)
	require.False(t, draining(l.a))
	l.a.q.Run(l.a.env, l.now, 1000)
	require.Empty(t, l.a.env.take(), "the WR posted before SQD had not started: it waits")
	require.Equal(t, 1, w.events)

	require.NoError(t, l.a.q.Modify(&Attr{State: SQD}, AttrState, l.now))
	require.Equal(t, 2, w.events, "SQD->SQD drains again; the notify attribute persists")
	require.NoError(t, l.a.q.Modify(&Attr{State: RTS}, AttrState, l.now))
	require.NoError(t, l.a.q.Modify(&Attr{State: SQD}, AttrState, l.now))
	require.Equal(t, 3, w.events, "RTS->SQD without the mask bit keeps en_sqd_async_notify")
	require.NoError(t, l.a.q.Modify(&Attr{State: RTS}, AttrState, l.now))
	require.Equal(t, 3, w.events)
	l.a.q.Run(l.a.env, l.now, 1000)
	require.Len(t, l.a.env.take(), 1)
}

// UD and UC get no responses: a WQE is done once its packets are out, so
// the drain ends as soon as the requester has sent what it started.
func TestSQDUnreliableDrainsWithoutResponses(t *testing.T) {
	for _, typ := range []Type{UD, UC} {
		t.Run(typ.String(), func(t *testing.T) {
			l := newLink(t, typ, 0, 0)
			w := watchDrain(t, l.a)
			wr := func(id uint64, n int) SendWR {
				return SendWR{ID: id, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, n)},
					AV: AddrVector{DGID: l.b.addr.Addr()}, RemoteQPN: l.b.q.Num(), RemoteQKey: 0x1234}
			}
			n := 200
			if typ == UC {
				n = 600 // 3 packets at MTU 256
			}
			for i := range 2 {
				x := wr(uint64(i+1), n)
				require.NoError(t, l.a.q.PostSend(&x))
			}
			l.a.q.Run(l.a.env, l.now, 2) // UD: both; UC: two packets of WR 1
			first := l.a.env.take()
			require.Len(t, first, 2)
			toSQD(t, l, l.a, true)
			if typ == UC {
				require.True(t, draining(l.a), "WR 1 is in mid-message")
				require.Zero(t, w.events)
				l.a.q.Run(l.a.env, l.now, 1000)
				rest := l.a.env.take()
				require.Equal(t, []wire.Opcode{wire.UCSendLast}, opcodes(rest), "WR 1 finishes, WR 2 waits")
			}
			require.False(t, draining(l.a))
			require.Equal(t, 1, w.events)
			wcs := poll(t, l.a.scq)
			wantDone := 2
			if typ == UC {
				wantDone = 1
			}
			require.Len(t, wcs, wantDone)

			x := wr(9, 8)
			require.NoError(t, l.a.q.PostSend(&x))
			l.a.q.Run(l.a.env, l.now, 1000)
			require.Empty(t, l.a.env.take(), "nothing starts in SQD")
			require.NoError(t, l.a.q.Modify(&Attr{State: RTS}, AttrState, l.now))
			l.a.q.Run(l.a.env, l.now, 1000)
			want := 1 // WR 9
			if typ == UC {
				want = 3 + 1 // WR 2, then WR 9
			}
			require.Len(t, l.a.env.take(), want)
			require.Len(t, poll(t, l.a.scq), 4-wantDone-1)
			require.Equal(t, 1, w.events)
		})
	}
}

// ERR interrupts a drain (the only state change allowed during one):
// the outstanding WQEs are flushed and no drained event follows. RESET
// is refused while draining, as rxe refuses every state but ERR.
func TestSQDErrInterruptsDrain(t *testing.T) {
	l, w, req := writeThenSQD(t, true)
	require.ErrorIs(t, l.a.q.Modify(&Attr{State: Reset}, AttrState, l.now), ErrSQDraining)
	require.Equal(t, SQD, l.a.q.State())
	// A modify that changes no state is not a transition: allowed.
	require.NoError(t, l.a.q.Modify(&Attr{MinRNRTimer: 5}, AttrMinRNRTimer, l.now))
	require.NoError(t, l.a.q.Modify(&Attr{State: Err}, AttrState, l.now))
	require.False(t, draining(l.a))
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, 1)
	require.Equal(t, WCWRFlushErr, wcs[0].Status)
	// The peer still answers; the QP in ERR raises nothing.
	l.deliver(l.b, l.a, req...)
	require.Len(t, l.b.env.take(), 1)
	require.Zero(t, w.events)
	require.False(t, draining(l.a))
	// RESET and back to SQD: a fresh drain, nothing outstanding.
	require.NoError(t, l.a.q.Modify(&Attr{State: Reset}, AttrState, l.now))
	require.False(t, draining(l.a))
	require.NoError(t, l.a.q.Modify(&Attr{State: Init, PortNum: 1, AccessFlags: AccessRemoteWrite},
		l.initMask(RC), l.now))
	require.NoError(t, l.a.q.Modify(&Attr{State: RTR, AV: AddrVector{DGID: l.b.addr.Addr()}, PathMTU: MTU256,
		DestQPN: l.b.q.Num(), MaxDestRdAtomic: 1}, AttrState|AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|
		AttrMaxDestRdAtomic|AttrMinRNRTimer, l.now))
	require.NoError(t, l.a.q.Modify(&Attr{State: RTS, Timeout: 10, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
		AttrState|AttrSQPSN|AttrTimeout|AttrRetryCnt|AttrRNRRetry|AttrMaxQPRdAtomic, l.now))
	toSQD(t, l, l.a, true)
	require.Equal(t, 1, w.events)
	require.False(t, draining(l.a))
}

// The hook given to New is the one raised.
func TestSQDConfigHookIsCalled(t *testing.T) {
	e := newEnd(t, UD, 0x21, "10.0.0.9")
	var got []*QP
	q, err := New(Config{Num: 0x22, Type: UD, PD: e.pd, Mem: e.mem, SendCQ: e.scq, RecvCQ: e.rcq,
		Cap: Cap{MaxSendWR: 4}, OnSQDrained: func(q *QP) { got = append(got, q) }})
	require.NoError(t, err)
	now := time.Unix(1000, 0)
	require.NoError(t, q.Modify(&Attr{State: Init, PortNum: 1, QKey: 1}, AttrState|AttrPKeyIndex|AttrPort|AttrQKey, now))
	require.NoError(t, q.Modify(&Attr{State: RTR}, AttrState, now))
	require.NoError(t, q.Modify(&Attr{State: RTS}, AttrState|AttrSQPSN, now))
	require.NoError(t, q.Modify(&Attr{State: SQD, EnSQDAsyncNotify: true}, sqdNotify, now))
	require.Equal(t, []*QP{q}, got)
	a := q.Attr()
	require.True(t, a.EnSQDAsyncNotify)
	require.False(t, a.SQDraining)
}

// A WQE that fails during the drain takes the QP to ERR (QP fatal): the
// drain ends there, without an SQ-drained event.
func TestSQDFatalErrorEndsDrainWithoutEvent(t *testing.T) {
	l := newLink(t, RC, 7, 7)
	w := watchDrain(t, l.a)
	fatal := 0
	l.a.q.onErr = func(*QP) { fatal++ }
	l.post(SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 16)},
		RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey() ^ 0xFF00})
	req := l.a.env.take()
	toSQD(t, l, l.a, true)
	require.True(t, draining(l.a))
	l.deliver(l.b, l.a, req...)
	nak := l.b.env.take()
	require.Len(t, nak, 1)
	l.deliver(l.a, l.b, nak...)
	require.Equal(t, Err, l.a.q.State())
	require.Equal(t, 1, fatal)
	require.Zero(t, w.events)
	require.False(t, draining(l.a))
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, 1)
	require.Equal(t, WCRemAccessErr, wcs[0].Status)
}
