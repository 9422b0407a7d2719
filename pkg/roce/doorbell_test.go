package roce

import (
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/stretchr/testify/require"
)

// The doorbell batch (doorbell.go), on a timerRig (fake clock, a peer
// that records what arrives and never answers): while four goroutines
// spin, posts wait in the shard's batch and leave together when it
// holds doorbellBatchMax packets, or when the worker's timer finds the
// oldest DoorbellBatch old; with three spinners, or no DoorbellBatch,
// each post leaves before PostSend returns, as without the option.
// Spinners are counted, not run: the rig's engine has no poller (an
// in-memory Conn), so only the post and the timer paths send.
func TestDoorbellBatchHoldsPostsWhileFourSpin(t *testing.T) {
	r := newTimerRig(t, 5) // 5 QPs of 4 send WRs each
	w := r.e.workers[0]
	batched := func() (n int, kept bool) { // the shard's unsent batch
		w.own.Lock()
		defer w.own.Unlock()
		return w.txN, w.keptPosts
	}
	post := func(i int) {
		t.Helper()
		_, err := r.e.PostSend(r.qps[i], []qp.SendWR{{ID: uint64(i), Opcode: qp.WRSend, Flags: qp.Signaled | qp.Inline, Inline: []byte("d")}})
		require.NoError(t, err)
	}
	const span = 20 * time.Microsecond
	r.e.doorbell = span

	// Three spinners: a post leaves at once.
	r.e.spinners.Add(3)
	post(0)
	n, kept := batched()
	require.Zero(t, n, "a post with three spinners leaves before PostSend returns")
	require.False(t, kept)
	r.expect(t, []int{0}, "the post with three spinners")

	// Four: posts wait for each other; the 16th sends all of them.
	r.e.spinners.Add(1)
	var want []int
	for k := range doorbellBatchMax {
		i := 1 + k%4
		post(i)
		want = append(want, i)
		n, kept = batched()
		if k < doorbellBatchMax-1 {
			require.Equal(t, k+1, n, "post %d waits in the batch", k)
			require.True(t, kept, "post %d: the batch is kept for posts", k)
		}
	}
	require.Zero(t, n, "the batch left when it held %d packets", doorbellBatchMax)
	require.False(t, kept)
	require.Equal(t, uint64(1), r.e.Counters()[CounterDoorbellBatches], "one batch of posts so far")
	r.expect(t, want, "the batch's posts, in post order")

	// One more waits for company until its deadline, when the worker's
	// timer sends it; not a nanosecond before.
	posted := r.clock.Now()
	post(0)
	n, _ = batched()
	require.Equal(t, 1, n, "a lone post waits")
	d, ok := r.clock.NextDeadline()
	require.True(t, ok)
	require.Equal(t, posted.Add(span), d, "the worker's timer is armed for the post's deadline")
	r.clock.Advance(span - time.Nanosecond)
	n, _ = batched()
	require.Equal(t, 1, n, "still waiting a nanosecond before its deadline")
	r.clock.Advance(time.Nanosecond)
	r.expect(t, []int{0}, "the worker's timer sent the lone post at its deadline")
	require.Equal(t, uint64(2), r.e.Counters()[CounterDoorbellBatches])
	n, kept = batched()
	require.Zero(t, n)
	require.False(t, kept)

	// Without a DoorbellBatch, four spinners change nothing.
	r.e.doorbell = 0
	post(0)
	n, _ = batched()
	require.Zero(t, n, "without DoorbellBatch a post leaves at once")
	require.Equal(t, uint64(2), r.e.Counters()[CounterDoorbellBatches], "and starts no batch")
	r.expect(t, []int{0}, "the post without DoorbellBatch")
}

// An application's spin (SpinWhileBusy, what ib.HybridWaiter runs)
// counts as a spinner for the doorbell batch while it lasts.
func TestSpinnersCountApplicationSpins(t *testing.T) {
	r := newTimerRig(t, 1)
	var during int32
	n, _ := r.e.SpinWhileBusy(func() int { during = r.e.spinners.Load(); return 1 },
		func() bool { return false }, time.Millisecond, time.Millisecond)
	require.Equal(t, 1, n)
	require.Equal(t, int32(1), during, "a spinning application counts")
	require.Zero(t, r.e.spinners.Load(), "and stops counting when its spin ends")
}
