package roce

import (
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/polltest"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// A spinner on one engine receives for another engine of the process
// that nobody polls: b's Conn delivers only to pollers (polltest.Only), b
// itself is never polled, and a's ProgressOthers alone brings a's SEND
// into b's receive queue and b's ACK back to a.
func TestProgressOthersReceivesForAnUnpolledEngine(t *testing.T) {
	a := newUDPSide(t, "127.0.0.1", false)
	b := newUDPSide(t, "127.0.0.1", true)
	connectUDP(t, a, b)
	amr, abuf := regMR(t, a, 4096)
	bmr, bbuf := regMR(t, b, 4096)
	_, err := b.e.PostRecv(b.q, []qp.RecvWR{{ID: 7, SGL: []qp.SGE{{Addr: bmr.IOVA(), Length: 64, LKey: bmr.LKey()}}}})
	require.NoError(t, err)
	copy(abuf, "for b")
	_, err = a.e.PostSend(a.q, []qp.SendWR{{ID: 1, Opcode: qp.WRSend, Flags: qp.Signaled,
		SGL: []qp.SGE{{Addr: amr.IOVA(), Length: 5, LKey: amr.LKey()}}}})
	require.NoError(t, err)

	wc, took := spinForWC(t, b.rcq, func() int { return ProgressOthers(a.e) })
	require.Equal(t, qp.WCSuccess, wc.Status)
	require.EqualValues(t, 7, wc.ID)
	require.Equal(t, "for b", string(bbuf[:5]))
	require.Positive(t, took)
	require.Zero(t, b.e.polledAt.Load(), "b was never polled by its own application")
	// b's ACK completes a's SEND through a's own receive loop.
	require.Equal(t, qp.WCSuccess, waitWC(t, a.scq).Status)
}

// An engine its own application has just polled (or that has just
// received a long batch) is left to it; one never polled, or not for a
// while, is helped.
func TestRecentMarks(t *testing.T) {
	const now = int64(10 * time.Second)
	for _, c := range []struct {
		polledAt int64
		want     bool
	}{
		{0, false},                           // never polled
		{now, true},                          // polled just now
		{now - int64(recentSpan), true},      // at the bound
		{now - int64(recentSpan) - 1, false}, // just past it
		{now - int64(time.Second), false},    // long ago
	} {
		require.Equal(t, c.want, recent(now, c.polledAt), "polled at %d", c.polledAt)
	}
}

// newLoggedSide is a side whose Conn receives only when polled
// (polltest.Only) and logs its polls and covers in log under name.
func newLoggedSide(t *testing.T, addr, name string, log *pollLog) *side {
	t.Helper()
	a := netip.MustParseAddr(addr)
	uc, err := transport.OpenUDP(transport.UDPConfig{Addrs: []netip.Addr{a}})
	require.NoError(t, err)
	c, err := polltest.Only(uc)
	require.NoError(t, err)
	return sideOn(t, newProbedPoller(c, name, log), a, qp.RC, sideCap)
}

// waitSent waits until e has sent n packets in all.
func waitSent(t *testing.T, e *Engine, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.Counters()["sent_pkts"] < n {
		require.False(t, time.Now().After(deadline), "sent %d packets, want %d", e.Counters()["sent_pkts"], n)
		runtime.Gosched()
	}
}

// requestAtPeer opens two logged, poll-only sides a and b, connected,
// with a receive (ID 7, 64 bytes into bbuf) posted at b and a's signaled
// SEND (ID 1) of "request" sent into b's socket, where nobody has taken
// it yet; the log is empty.
func requestAtPeer(t *testing.T) (log *pollLog, a, b *side, bbuf []byte) {
	t.Helper()
	log = &pollLog{}
	a = newLoggedSide(t, "127.0.0.1", "a", log)
	b = newLoggedSide(t, "127.0.0.1", "b", log)
	connectUDP(t, a, b)
	amr, abuf := regMR(t, a, 4096)
	bmr, bbuf := regMR(t, b, 4096)
	_, err := b.e.PostRecv(b.q, []qp.RecvWR{{ID: 7, SGL: []qp.SGE{{Addr: bmr.IOVA(), Length: 64, LKey: bmr.LKey()}}}})
	require.NoError(t, err)
	copy(abuf, "request")
	_, err = a.e.PostSend(a.q, []qp.SendWR{{ID: 1, Opcode: qp.WRSend, Flags: qp.Signaled,
		SGL: []qp.SGE{{Addr: amr.IOVA(), Length: 7, LKey: amr.LKey()}}}})
	require.NoError(t, err)
	waitSent(t, a.e, 1)
	log.take()
	return log, a, b, bbuf
}

// A spinner with its peer in the same process polls the peer before
// itself (ProgressWithOthers): the request it just posted waits in the
// peer's socket, and the peer's answer comes into its own socket during
// the peer's send, so one call can take both; polling itself first
// found its socket empty on every round trip (session N). Both engines
// receive only when polled, so the log is the spinner's doing.
func TestProgressWithOthersPollsThePeerFirst(t *testing.T) {
	log, a, b, bbuf := requestAtPeer(t)

	// Every call polls b, then a; spinning on until a's SEND (b's ACK)
	// completes, b's poll takes the request.
	request := false
	wc, took := spinForWC(t, a.scq, func() int {
		n := a.e.ProgressWithOthers()
		var polls []string
		for _, ev := range log.take() {
			if strings.Contains(ev, " poll ") {
				polls = append(polls, ev)
			}
		}
		require.Len(t, polls, 2, "one poll of each engine: %v", polls)
		require.True(t, strings.HasPrefix(polls[0], "b poll "), "the peer first: %v", polls)
		require.True(t, strings.HasPrefix(polls[1], "a poll "), "then the spinner's own: %v", polls)
		request = request || polls[0] == "b poll 1"
		return n
	})
	require.True(t, request, "b's poll took the request")
	require.Equal(t, qp.WCSuccess, wc.Status)
	require.EqualValues(t, 1, wc.ID)
	require.Equal(t, 2, took, "the SEND at b and its ACK at a")
	var recv [1]qp.WC
	require.Equal(t, 1, b.rcq.Poll(recv[:]))
	require.EqualValues(t, 7, recv[0].ID)
	require.Equal(t, "request", string(bbuf[:7]))
}

// A spinner's poll covers the socket when it took nothing or a short
// batch and ends the cover when it took more (progressCovering): a
// spinner whose every poll takes an answer keeps its socket covered, or
// each answer would wake the receive goroutine (session N).
func TestProgressCoversWhileItKeepsUp(t *testing.T) {
	for _, c := range []struct {
		n    int
		want bool
	}{{0, true}, {1, true}, {inlineBatch, true}, {inlineBatch + 1, false}, {64, false}} {
		require.Equal(t, c.want, keepsUp(c.n), "%d packets", c.n)
	}

	log := &pollLog{}
	a := newUDPSide(t, "127.0.0.1", false)
	b := newLoggedSide(t, "127.0.0.1", "b", log)
	connectUDP(t, a, b)
	bmr, _ := regMR(t, b, 4096)
	for i := range 32 {
		_, err := b.e.PostRecv(b.q, []qp.RecvWR{{ID: uint64(i), SGL: []qp.SGE{{Addr: bmr.IOVA(), Length: 64, LKey: bmr.LKey()}}}})
		require.NoError(t, err)
	}
	send := func(k int) {
		for range k {
			_, err := a.e.PostSend(a.q, []qp.SendWR{{Opcode: qp.WRSend, Flags: qp.Inline, Inline: []byte("x")}})
			require.NoError(t, err)
		}
	}
	// While another goroutine receives, a poll takes nothing and leaves
	// the cover alone.
	b.e.rxMu.Lock()
	require.Zero(t, b.e.progressCovering())
	b.e.rxMu.Unlock()
	require.Empty(t, log.take(), "no poll, no cover decision while busy")

	sent := a.e.Counters()["sent_pkts"]
	for _, k := range []int{0, 1, 16} {
		send(k)
		sent += uint64(k)
		waitSent(t, a.e, sent)
		got := 0
		for got < k || k == 0 {
			got += b.e.Progress()
			ev := log.take()
			require.Len(t, ev, 2, "a poll and its cover decision: %v", ev)
			var n int
			_, err := fmt.Sscanf(ev[0], "b poll %d", &n)
			require.NoError(t, err, ev[0])
			want := "b uncover"
			if keepsUp(n) {
				want = "b cover"
			}
			require.Equal(t, want, ev[1], "after %q", ev[0])
			// A long batch marks a stream, which others leave to b.
			if !keepsUp(n) {
				require.NotZero(t, b.e.streamingAt.Load(), "a batch of %d is a stream", n)
			} else if k <= 1 {
				require.Zero(t, b.e.streamingAt.Load(), "a batch of %d is no stream", n)
			}
			if k == 0 {
				break
			}
		}
	}
}

// A goroutine about to sleep takes what is queued as a spinner does, its
// in-process peer first and covering each socket, and returns at once
// with what it found; only a pass that finds nothing hands the sockets
// back (uncover) and polls once more before it may sleep. An engine whose
// application sleeps on its completions is left to its own receive
// goroutine (session O: the WRITE round trip in event mode ran in the
// receive goroutines, 7.3 us against 4.6 in the caller's; doing a
// sleeping SEND peer's work split its ACK from its answer).
func TestProgressBeforeSleepPollsThePeerFirst(t *testing.T) {
	log, a, b, bbuf := requestAtPeer(t)

	// b's application sleeps on b's completions: a leaves b alone.
	b.e.BeginSleep()
	require.Zero(t, a.e.ProgressBeforeSleep())
	require.Equal(t, []string{"a uncover", "b uncover", "a poll 0"}, log.take(), "no covering pass without another engine to help")
	var recv [1]qp.WC
	require.Zero(t, b.rcq.Poll(recv[:]), "the request still waits in b's socket")
	b.e.EndSleep()

	// Now a takes b's request first and covers both sockets; having
	// found work it returns without handing them back.
	require.Positive(t, a.e.ProgressBeforeSleep())
	ev := log.take()
	require.GreaterOrEqual(t, len(ev), 4, "%v", ev)
	require.Equal(t, []string{"b poll 1", "b cover"}, ev[:2], "the peer first: %v", ev)
	require.True(t, strings.HasPrefix(ev[2], "a poll "), "then its own: %v", ev)
	require.Equal(t, "a cover", ev[3], "%v", ev)
	require.NotContains(t, strings.Join(ev, ","), "uncover", "found work: no sleep, no hand-back")
	// Handled inline, or by b's worker when it held b's shard (a timer's
	// work): then the request reaches b's CQ after the call returned.
	// Asserted at once, it failed a loaded -race run (session R's flake
	// hunt), as TestHelpSleepingPeersTakesOnlyASleepersPackets once did.
	got := waitWC(t, b.rcq)
	require.Equal(t, qp.WCSuccess, got.Status)
	require.EqualValues(t, 7, got.ID)
	require.Equal(t, "request", string(bbuf[:7]))

	// b's ACK completes a's SEND in a's own goroutine.
	wc, _ := spinForWC(t, a.scq, a.e.ProgressBeforeSleep)
	require.Equal(t, qp.WCSuccess, wc.Status)
	require.EqualValues(t, 1, wc.ID)
	log.take()

	// Nothing queued: one covering pass, the hand-back, one more pass.
	require.Zero(t, a.e.ProgressBeforeSleep())
	require.Equal(t, []string{"b poll 0", "b cover", "a poll 0", "a cover", "a uncover", "b uncover", "b poll 0", "a poll 0"}, log.take())
}

// Another engine's spinner or sleeper leaves alone an engine that is
// streaming (received a batch longer than inlineBatch lately): its
// receive goroutine carries the stream on a CPU of its own, where a
// spinner doing its work serialises both ends on one (session O).
func TestOthersLeaveAStreamToItsReceiveGoroutine(t *testing.T) {
	log := &pollLog{}
	a := newLoggedSide(t, "127.0.0.1", "a", log)
	b := newLoggedSide(t, "127.0.0.1", "b", log)
	connectUDP(t, a, b)
	polledB := func() bool {
		ProgressOthers(a.e)
		for _, ev := range log.take() {
			if strings.HasPrefix(ev, "b poll") {
				return true
			}
		}
		return false
	}
	require.True(t, polledB(), "never streamed")
	// A mark an hour ahead stays recent however slowly the test runs.
	b.e.streamingAt.Store(nanotime() + int64(time.Hour))
	require.False(t, polledB(), "streaming now")
	require.Zero(t, a.e.ProgressBeforeSleep())
	for _, ev := range log.take() {
		require.False(t, strings.HasPrefix(ev, "b poll"), "a sleeper leaves the stream alone too: %v", ev)
	}
	b.e.streamingAt.Store(nanotime() - int64(recentSpan) - 1)
	require.True(t, polledB(), "the stream ended a while ago")
}

// After a short batch a receive goroutine takes what an in-process peer
// whose application sleeps on its completions has queued
// (helpSleepingPeers), as the peer's own receive goroutine would: the
// request reaches the peer's CQ and the peer's ACK completes the
// sender's SEND. A peer nobody sleeps on, one its own application spins
// on, or one the batch did not come from is left alone, and the helper
// never polls its own socket
// (session P: the SEND ping-pong in event mode then runs in one
// goroutine instead of waking each side's receive goroutine in turn).
func TestHelpSleepingPeersTakesOnlyASleepersPackets(t *testing.T) {
	log, a, b, bbuf := requestAtPeer(t)
	polls := func() []string {
		var p []string
		for _, ev := range log.take() {
			if strings.Contains(ev, " poll ") {
				p = append(p, ev)
			}
		}
		return p
	}

	fromB := b.e.conn.LocalAddrs()[0]
	a.e.helpSleepingPeers(fromB)
	require.Empty(t, polls(), "nobody sleeps on b's completions")

	b.e.BeginSleep()
	defer b.e.EndSleep()
	// A mark an hour ahead stays recent however slowly the test runs.
	b.e.polledAt.Store(nanotime() + int64(time.Hour))
	a.e.helpSleepingPeers(fromB)
	require.Empty(t, polls(), "b's own application spins as well")
	b.e.polledAt.Store(0)

	notB := netip.AddrPortFrom(fromB.Addr(), fromB.Port()+1)
	a.e.helpSleepingPeers(notB)
	require.Empty(t, polls(), "the batch came from elsewhere: b is not where the answer went")
	a.e.helpSleepingPeers(netip.AddrPort{})
	require.Empty(t, polls(), "a source the transport did not report")

	sent := b.e.Counters()["sent_pkts"]
	a.e.helpSleepingPeers(fromB)
	require.Equal(t, []string{"b poll 1"}, polls(), "b's request taken; a's own socket is its receive loop's")
	// Handled inline, or by b's worker if it was busy, as for b's receive
	// goroutine; either way b receives it and sends its ACK.
	recv := waitWC(t, b.rcq)
	require.Equal(t, qp.WCSuccess, recv.Status)
	require.EqualValues(t, 7, recv.ID)
	require.Equal(t, "request", string(bbuf[:7]))
	waitSent(t, b.e, sent+1)

	// That ACK completes a's SEND.
	wc, _ := spinForWC(t, a.scq, a.e.Progress)
	require.Equal(t, qp.WCSuccess, wc.Status)
	require.EqualValues(t, 1, wc.ID)
}
