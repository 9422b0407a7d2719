package conform

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestArrivalIsStampedByTheKernel: a packet read late (the link's
// receive goroutine busy, or descheduled on a loaded host) is timed when
// it arrived, by the kernel's stamp, not when it was read. Bug (CI-style
// run of session AK, TestGoBackJudgesTheResendFromItsTransmission): the
// first transmission of a requester was read late, its Rx.At moved
// towards the timer-driven resend, and Q-SEQ-GOBACK judged a requester
// that ignores the NAK as driven by it (PASS where FAIL is right).
//
// The wait below is not a synchronisation: it is the lateness being
// measured. The receive goroutine cannot read the second packet before
// the lock is released (it is blocked recording the first, or has not
// read it yet), so read-time stamping gives at least the wait.
func TestArrivalIsStampedByTheKernel(t *testing.T) {
	pc, peer, port := bindFakePeer(t)
	defer pc.Close()
	l, err := openLinkClock(netip.AddrPortFrom(loopback, port), netip.AddrPortFrom(peer, port), realClock{})
	require.NoError(t, err)
	defer l.Close()

	const lateBy = 30 * time.Millisecond
	l.mu.Lock() // the receive goroutine records each packet under mu
	for _, b := range [][]byte{{1}, {2}} {
		_, err := pc.WriteToUDPAddrPort(b, netip.AddrPortFrom(loopback, port))
		require.NoError(t, err)
	}
	sent := l.Since() // loopback queues a datagram inside the send call
	time.Sleep(lateBy)
	l.mu.Unlock()

	var at []time.Duration
	for range 2 {
		select {
		case r := <-l.rx:
			at = append(at, r.At)
		case <-time.After(10 * time.Second):
			t.Fatal("the link did not deliver both packets")
		}
	}
	require.LessOrEqual(t, at[1], sent+time.Millisecond,
		"the second packet arrived before %v and was read %v later: its At %v is the read, not the arrival", sent, lateBy, at[1])
}
