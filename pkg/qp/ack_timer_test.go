package qp

import (
	"fmt"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// The local ACK timer follows the outstanding work: a coalesced ACK that
// completes the last WQE sent stops it, and the next request arms it
// anew. Bug (give-up audit, item 1): handleResponse's loop returned as
// soon as no WQE was left to check, before any rearm, so the deadline of
// the earlier timeout stayed armed; the WQE resent next was timed out
// early, a retry spent and the WQE resent again while its answer was on
// the way. Here the timeout's go-back resends A (64 packets, the
// engine's runBudget) and B waits its turn; the late ACK of B's first
// copy then completes A, leaving nothing outstanding.
func TestCoalescedAckLeavesNoStaleLocalACKTimer(t *testing.T) {
	const budget = 64
	l := giveUpLink(t, 14, 7, 7, 3)
	T := RetransmitTimeout(14)
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{l.b.sge(0, 64<<10)}}))
	wr := func(id uint64) *SendWR {
		return &SendWR{ID: id, Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{l.a.sge(0, 64<<10)},
			RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()}
	}
	require.NoError(t, l.a.q.PostSend(wr(1)))
	require.NoError(t, l.a.q.PostSend(wr(2)))
	t0 := l.now
	for l.a.q.Run(l.a.env, l.now, budget) {
	}
	reqs := l.a.env.take()
	require.Len(t, reqs, 128)
	l.deliver(l.b, l.a, reqs...)
	acks := l.b.env.take() // held: the path is slow
	require.NotEmpty(t, acks)
	lastAck := acks[len(acks)-1]
	require.Equal(t, psns(reqs)[127], psns([][]byte{lastAck})[0], "the ACK of B's last packet")

	// The timeout: go back, one retry; the budget resends A only.
	l.now = t0.Add(T)
	require.Equal(t, l.now, l.a.q.Deadline())
	require.True(t, l.a.q.OnTimer(l.a.env, l.now, budget), "B still to resend")
	require.Len(t, l.a.env.take(), 64)
	require.Equal(t, uint64(1), l.a.q.ctr.CompleterRetryErr.Load())

	// B's first ACK arrives late: it acknowledges A (coalesced); B waits
	// for the requester's next pass, so nothing is outstanding.
	l.now = l.now.Add(T / 2)
	var p wire.Packet
	require.NoError(t, p.Parse(lastAck))
	ri := RecvInfo{Src: l.b.addr, Dst: l.a.addr}
	require.Equal(t, DropNone, l.a.q.Check(&p, &ri, l.a.addr.Addr()))
	l.a.q.Receive(l.a.env, &p, &ri, l.now) // not run yet
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, 1)
	require.Equal(t, uint64(1), wcs[0].ID)
	require.Equal(t, l.a.q.req.psn, l.a.q.comp.psn, "nothing outstanding")
	require.True(t, l.a.q.retransmitAt.IsZero(), "no local ACK timer with nothing outstanding")

	// B is resent and its answer takes 3T/4, past the earlier timeout's
	// deadline (t0 + 2T, T/2 after the resend): B's own timer is armed
	// with it and no retry is spent.
	resend := l.now
	for l.a.q.Run(l.a.env, l.now, budget) {
	}
	again := l.a.env.take()
	require.Len(t, again, 64)
	require.Equal(t, resend.Add(T), l.a.q.retransmitAt, "armed anew for B")
	answerAt := resend.Add(3 * T / 4)
	for steps := 0; ; steps++ {
		require.Less(t, steps, 100)
		if d := l.a.q.Deadline(); !d.IsZero() && d.Before(answerAt) {
			l.now = d
			l.a.q.OnTimer(l.a.env, l.now, budget)
			continue
		}
		break
	}
	l.now = answerAt
	l.deliver(l.b, l.a, again...)
	l.deliver(l.a, l.b, l.b.env.take()...)
	wcs = poll(t, l.a.scq)
	require.Len(t, wcs, 1)
	require.Equal(t, WCSuccess, wcs[0].Status)
	require.Equal(t, uint64(2), wcs[0].ID)
	require.Equal(t, uint64(1), l.a.q.ctr.RetransmitTimeouts.Load(), "the one real timeout")
	require.Equal(t, uint64(1), l.a.q.ctr.CompleterRetryErr.Load(), "no retry spent on B's resend")
	require.True(t, l.a.q.retransmitAt.IsZero())
}

// The local ACK timeout is at least a jiffy of the peers' kernels (4 ms
// at HZ 250), as rxe floors it at one jiffy; 0 stays "no timer". Bug
// (give-up audit, item 2): timeout 1 gave 8 us, so a live QP whose round
// trip was longer spent a retry on every request and, with retry_cnt 0,
// failed its first WR with RETRY_EXC_ERR on a healthy link.
func TestLocalACKTimeoutFlooredAtAJiffy(t *testing.T) {
	require.Zero(t, RetransmitTimeout(0))
	for to := uint8(1); to <= 9; to++ {
		require.Equal(t, MinRetransmitTimeout, RetransmitTimeout(to), "timeout %d", to)
	}
	require.Equal(t, 4194304*time.Nanosecond, RetransmitTimeout(10), "IBA's value from 10 on")
	require.Equal(t, 67108864*time.Nanosecond, RetransmitTimeout(14))
	require.Equal(t, RetransmitTimeout(31), RetransmitTimeout(40))

	const rtt = 2 * time.Millisecond // a loaded host or an emulated guest
	for _, to := range []uint8{1, 5, 9} {
		t.Run(fmt.Sprint("timeout=", to), func(t *testing.T) {
			l := giveUpLink(t, to, 0, 7, 3)
			require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 1, SGL: []SGE{l.b.sge(0, 100)}}))
			t0 := l.now
			l.post(SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 100)}})
			require.Equal(t, t0.Add(MinRetransmitTimeout), l.a.q.Deadline())
			reqs := l.a.env.take()
			// The timers due before the answer arrives run first.
			for d := l.a.q.Deadline(); !d.IsZero() && d.Before(t0.Add(rtt)); d = l.a.q.Deadline() {
				l.now = d
				l.a.q.OnTimer(l.a.env, l.now, 100)
			}
			l.now = t0.Add(rtt)
			l.deliver(l.b, l.a, reqs...)
			l.deliver(l.a, l.b, l.b.env.take()...)
			wcs := poll(t, l.a.scq)
			require.Len(t, wcs, 1)
			require.Equal(t, WCSuccess, wcs[0].Status)
			require.Zero(t, l.a.q.ctr.RetransmitTimeouts.Load())
		})
	}

	// Timeout 0: no local ACK timer at all (IBA 9.7.6.1.3).
	l := giveUpLink(t, 0, 0, 7, 3)
	l.post(SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 100)}})
	require.Len(t, l.a.env.take(), 1)
	require.True(t, l.a.q.Deadline().IsZero())
}

// An RNR NAK refills no retry_cnt, as in rxe (rxe_comp.c: check_ack's
// AETH_RNR_NAK only counts rcvd_rnr_err, COMPST_RNR_RETRY only spends
// rnr_retry; reset_retry_counters runs for ACKs, READ responses and
// atomic ACKs). Bug (give-up audit, item 3): any response inside the
// outstanding window refilled it, so with retry_cnt 1 a SEND whose first
// copy was lost, then RNR-NAKed, then sent into a dead peer, was given up
// two local ACK timeouts after the RNR retry's resend instead of one.
func TestRNRNakRefillsNoRetryCnt(t *testing.T) {
	const minRNR = 22 // 20.48 ms
	l := giveUpLink(t, 14, 1, 7, minRNR)
	T := RetransmitTimeout(14)
	l.post(SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: []SGE{l.a.sge(0, 100)}})
	require.Len(t, l.a.env.take(), 1, "lost")
	l.now = l.a.q.Deadline()
	l.a.q.OnTimer(l.a.env, l.now, 100)
	require.Equal(t, uint64(1), l.a.q.ctr.CompleterRetryErr.Load(), "the one retry spent")
	require.Zero(t, l.a.q.comp.retryCnt)
	l.deliver(l.b, l.a, l.a.env.take()...) // no receive posted
	nak := l.b.env.take()
	require.Len(t, nak, 1)
	l.now = l.now.Add(time.Millisecond)
	l.deliver(l.a, l.b, nak...)
	require.Equal(t, uint64(1), l.a.q.ctr.RcvdRNRErr.Load())
	require.Zero(t, l.a.q.comp.retryCnt, "the RNR NAK refilled retry_cnt")

	// The RNR wait ends, the SEND is resent into a peer now dead: the
	// first local ACK timeout after it fails the WR.
	l.now = l.a.q.Deadline()
	require.Equal(t, l.a.q.rnrAt, l.now)
	resend := l.now
	at, st, _ := l.untilSendError()
	require.Equal(t, WCRetryExcErr, st)
	require.Equal(t, T, at.Sub(resend))
	require.Equal(t, uint64(1), l.a.q.ctr.CompleterRetryErr.Load())
}
