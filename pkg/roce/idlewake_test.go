package roce

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// alarmFor: the pending alarm is kept while it goes off no earlier than
// the earliest deadline and no later than half the wait after it;
// otherwise it is set for the deadline plus half the wait.
func TestAlarmFor(t *testing.T) {
	const us = int64(time.Microsecond)
	for _, tc := range []struct {
		name               string
		pending, now, next int64
		wantAt             int64
		wantSet            bool
	}{
		{"no deadline", 0, 1000 * us, 0, 0, false},
		{"deadline already due", 0, 1000 * us, 900 * us, 0, false},
		{"first alarm", 0, 1000 * us, 1250 * us, 1375 * us, true},
		{"pending alarm past", 900 * us, 1000 * us, 1250 * us, 1375 * us, true},
		{"pending alarm fits", 1300 * us, 1000 * us, 1250 * us, 1300 * us, false},
		{"pending alarm at the deadline fits", 1250 * us, 1000 * us, 1250 * us, 1250 * us, false},
		{"pending alarm at the end of the slack fits", 1375 * us, 1000 * us, 1250 * us, 1375 * us, false},
		{"pending alarm before the deadline (it moved later)", 1200 * us, 1000 * us, 1250 * us, 1375 * us, true},
		{"pending alarm too late (an earlier deadline came)", 1500 * us, 1000 * us, 1250 * us, 1375 * us, true},
	} {
		at, set := alarmFor(tc.pending, tc.now, tc.next)
		require.Equal(t, tc.wantSet, set, tc.name)
		if set {
			require.Equal(t, tc.wantAt, at, tc.name)
		}
	}
}

// recordingWaker is an idleWaker whose alarm records what it is set for.
func recordingWaker() (*idleWaker, *[]time.Duration) {
	var mu sync.Mutex
	var set []time.Duration
	w := &idleWaker{arm: func(d time.Duration) error {
		mu.Lock()
		set = append(set, d)
		mu.Unlock()
		return nil
	}}
	return w, &set
}

// The idle waker sets its alarm for the earliest short deadline of the
// registered timers, a system call only when the pending alarm does not
// fit it: nothing for the clean path (no deadline worth an alarm), nor
// for a deadline moving later within the slack, nor for long deadlines;
// again when a deadline passes the alarm or an earlier one appears; and
// the earliest across timers, of registered timers only.
func TestIdleWakerSetsTheAlarmForTheEarliestShortDeadline(t *testing.T) {
	w, set := recordingWaker()
	var a, b atomic.Int64
	w.register(&a)
	w.register(&b)
	t0 := processStart.Add(time.Second)
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	w.wakeBy(&a, t0, time.Time{}) // a timer not worth an alarm
	require.Empty(t, *set, "the clean path sets nothing")

	w.wakeBy(&a, t0, at(200*time.Microsecond))
	require.Equal(t, []time.Duration{300 * time.Microsecond}, *set, "the deadline plus half the wait")
	w.wakeBy(&a, at(10*time.Microsecond), at(250*time.Microsecond))
	require.Len(t, *set, 1, "the deadline moved later, still before the alarm")
	w.wakeBy(&a, at(100*time.Microsecond), at(350*time.Microsecond))
	require.Equal(t, 375*time.Microsecond, (*set)[1], "passed the alarm: set again")

	w.wakeBy(&b, at(100*time.Microsecond), at(20*time.Millisecond))
	require.Len(t, *set, 2, "a long deadline needs no alarm")
	w.wakeBy(&b, at(100*time.Microsecond), at(150*time.Microsecond))
	require.Len(t, *set, 3, "an earlier deadline on another timer")
	require.Equal(t, 75*time.Microsecond, (*set)[2])
	w.wakeBy(&b, at(110*time.Microsecond), time.Time{})
	require.Len(t, *set, 4, "b stopped: the alarm goes back to a's deadline")
	require.Equal(t, 360*time.Microsecond, (*set)[3])

	var c atomic.Int64 // never registered
	w.wakeBy(&c, at(110*time.Microsecond), at(140*time.Microsecond))
	require.Len(t, *set, 4, "an unregistered timer is not among the deadlines")
	w.unregister(&a)
	w.wakeBy(&b, at(140*time.Microsecond), at(900*time.Microsecond))
	require.Len(t, *set, 5)
	require.Equal(t, 760*time.Microsecond+380*time.Microsecond, (*set)[4], "a's deadline is forgotten")

	var none *idleWaker // a platform without an alarm
	none.wakeBy(&a, t0, at(time.Microsecond))
	none.register(&a)
	none.unregister(&a)
}

// An engine on the system clock sets the process's alarm for a QP that is
// losing packets, and never on clean traffic: the wiring of rearm and
// qp.QP.LossRecent. WRITEs over an in-memory network, 5% of one side's
// datagrams lost (seeded), against the same WRITEs without loss.
func TestEngineSetsTheIdleAlarmOnlyForALosingQP(t *testing.T) {
	for _, loss := range []float64{0, 0.05} {
		w, set := recordingWaker()
		saved := systemWaker()
		processWaker = w
		net := transport.NewMemNetwork()
		aAddr, bAddr := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
		ca, err := net.Listen(netip.AddrPortFrom(aAddr, transport.RoCEv2Port))
		require.NoError(t, err)
		var conn transport.Conn = ca
		if loss > 0 {
			conn = transport.NewFaulty(ca, transport.FaultConfig{Loss: loss, Seed: 7})
		}
		a := sideWith(t, Config{Conn: conn, Workers: 2}, aAddr, qp.RC, sideCap)
		cb, err := net.Listen(netip.AddrPortFrom(bAddr, transport.RoCEv2Port))
		require.NoError(t, err)
		b := sideWith(t, Config{Conn: cb, Workers: 2}, bAddr, qp.RC, sideCap)
		processWaker = saved
		connect(t, a, b, qp.MTU1024, 14)
		amr, _ := regMR(t, a, 16384)
		bmr, _ := regMR(t, b, 16384)
		for i := range 60 {
			_, err := a.e.PostSend(a.q, []qp.SendWR{{ID: uint64(i), Opcode: qp.WRRDMAWrite, Flags: qp.Signaled,
				SGL: []qp.SGE{{Addr: amr.IOVA(), Length: 16384, LKey: amr.LKey()}}, RemoteAddr: bmr.IOVA(), RKey: bmr.RKey()}})
			require.NoError(t, err)
			require.Equal(t, qp.WCSuccess, waitWC(t, a.scq).Status)
		}
		naks := a.q.Counters().RcvdSeqErr.Load()
		w.mu.Lock()
		n := len(*set)
		w.mu.Unlock()
		if loss == 0 {
			require.Zero(t, naks)
			require.Zero(t, n, "clean traffic sets no alarm")
		} else {
			require.NotZero(t, naks, "the seed loses packets")
			require.NotZero(t, n, "a losing QP's short timers set the alarm")
		}
	}
}
