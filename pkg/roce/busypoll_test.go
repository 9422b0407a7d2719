package roce

import (
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// TestBusyPollReceivesByPolling: with Config.BusyPoll the receive
// goroutine polls the socket after a batch instead of blocking at once
// (busypoll.go): with a BusyPoll longer than the test, the responder's
// engine takes one batch by a blocking receive and every later datagram
// by polling, although nobody calls Progress; Close still stops it.
// Without BusyPoll nothing is polled.
func TestBusyPollReceivesByPolling(t *testing.T) {
	for _, busy := range []time.Duration{0, time.Hour} {
		a := newUDPSide(t, "127.0.0.1", false)
		uc, err := transport.OpenUDP(transport.UDPConfig{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
		require.NoError(t, err)
		p, ok := uc.(transport.Poller)
		require.True(t, ok && p.CanPoll(), "a one-socket UDP Conn can be polled here")
		cp := newProbedPoller(uc, "b", nil)
		b := sideWith(t, Config{Conn: cp, Workers: 2, IBATimerOnly: true, BusyPoll: busy}, netip.MustParseAddr("127.0.0.1"), qp.RC, sideCap)
		connectUDP(t, a, b)
		amr, abuf := regMR(t, a, 4096)
		bmr, bbuf := regMR(t, b, 4096)

		// WRITEs one at a time: each waits for its ACK, so b's socket
		// is empty between them and b's receive goroutine must either
		// poll or block again for the next.
		const writes = 50
		for i := range writes {
			abuf[i] = byte(i + 1)
			_, err := a.e.PostSend(a.q, []qp.SendWR{{ID: uint64(i), Opcode: qp.WRRDMAWrite, Flags: qp.Signaled,
				SGL: []qp.SGE{{Addr: amr.IOVA() + uint64(i), Length: 1, LKey: amr.LKey()}}, RemoteAddr: bmr.IOVA() + uint64(i), RKey: bmr.RKey()}})
			require.NoError(t, err)
			wc := waitWC(t, a.scq)
			require.Equal(t, qp.WCSuccess, wc.Status)
		}
		got := cp.blocking.Load() + cp.polled.Load()
		require.EqualValues(t, writes, got, "busy %v: b received every WRITE once", busy)
		if busy == 0 {
			require.Zero(t, cp.polled.Load(), "without BusyPoll nobody polls")
			require.EqualValues(t, writes, cp.blocking.Load())
		} else {
			require.EqualValues(t, 1, cp.blockingBatches.Load(), "busy-polling from the first batch on")
			require.EqualValues(t, writes-cp.blocking.Load(), cp.polled.Load())
			require.Positive(t, cp.polled.Load())
		}
		done := make(chan error, 1)
		go func() { done <- b.e.Close() }()
		select {
		case err := <-done:
			require.NoError(t, err)
			// After Close (its goroutines are done: the race detector
			// sees no socket between the responder and this one).
			require.Equal(t, abuf[:writes], bbuf[:writes])
		case <-time.After(20 * time.Second):
			t.Fatalf("busy %v: Close did not stop the busy-polling receive goroutine", busy)
		}
	}
}

// TestSpinWhileBusy: a spin (ib.HybridWaiter's, the busy poll's) lasts
// the budget on a silent device, and top (MaxSpin) after each batch a busy
// one receives, so a device that keeps receiving keeps the spinner (the lossy stream whose spinner slept at
// every gap: `rxed perf write --fault loss=0.01` made 24-34% less than
// with busy polling, for the receive goroutine's wake-ups). The clock
// moves 1 us per poll; receives and the completion come at the scripted
// polls.
func TestSpinWhileBusy(t *testing.T) {
	const us = time.Microsecond
	start := time.Unix(1000, 0)
	for _, c := range []struct {
		name        string
		budget, top time.Duration
		rxAt        []int // polls after which the device has received one more batch
		doneAt      int   // the poll that returns a completion (0: none)
		stopAt      int   // the poll after which stop reports the wait over (0: never)
		polls       int   // polls made
		n           int   // completions returned
		quiet       int   // us after start the device was last heard
	}{
		{name: "silent device: the budget", budget: 10 * us, top: 40 * us, polls: 10},
		{name: "silent, budget at its top", budget: 40 * us, top: 40 * us, polls: 40},
		{name: "one batch: MaxSpin after it", budget: 10 * us, top: 40 * us, rxAt: []int{5}, polls: 45, quiet: 5},
		{name: "batches closer than MaxSpin keep it spinning", budget: 10 * us, top: 40 * us,
			rxAt: []int{5, 30, 60, 99, 138}, polls: 178, quiet: 138},
		{name: "a silence of MaxSpin ends it", budget: 10 * us, top: 40 * us,
			rxAt: []int{5, 45, 90}, polls: 85, quiet: 45},
		{name: "a batch after the budget ran out is too late", budget: 10 * us, top: 40 * us, rxAt: []int{11}, polls: 10},
		{name: "the completion ends it", budget: 10 * us, top: 40 * us, rxAt: []int{5, 30}, doneAt: 50, polls: 50, n: 3, quiet: 30},
		{name: "a completion within the budget", budget: 10 * us, top: 40 * us, doneAt: 7, polls: 7, n: 3},
		// A context that ends, or a CQ destroyed, while the device keeps
		// receiving for other QPs: the spin ends at the next empty poll.
		{name: "stop ends a busy spin", budget: 10 * us, top: 40 * us, rxAt: []int{5, 30, 60, 90}, stopAt: 70, polls: 70, quiet: 60},
		{name: "stop ends a silent spin", budget: 10 * us, top: 40 * us, stopAt: 3, polls: 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			polls, rx := 0, uint64(7) // batches received before the wait do not count
			clock := start
			poll := func() int {
				polls++
				clock = clock.Add(us)
				for _, p := range c.rxAt {
					if p == polls {
						rx++
					}
				}
				if polls == c.doneAt {
					return 3
				}
				require.Less(t, polls, 10000, "never stopped")
				return 0
			}
			stop := func() bool { return c.stopAt > 0 && polls >= c.stopAt }
			n, quiet := spinWhileBusy(poll, func() uint64 { return rx }, func() time.Time { return clock }, stop, start, c.budget, c.top)
			require.Equal(t, c.n, n)
			require.Equal(t, c.polls, polls)
			require.Equal(t, time.Duration(c.quiet)*us, quiet.Sub(start))
		})
	}
}
