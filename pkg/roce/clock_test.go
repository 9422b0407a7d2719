package roce

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFakeTimerFiresAtItsDeadlineAndAtOnceForThePast: a fake timer fires
// on the Advance that reaches its deadline, not before; Stop disarms it;
// and, as with time.Timer, a Reset to a deadline already reached fires at
// once. Bug (session AF): such a Reset armed the timer for the current
// time and waited for the next Advance. A worker that re-arms its
// retransmit timer after the test's Advance had overtaken the deadline
// (the retransmission counted, then the test advanced, then the worker's
// rearm) then never fired, and TestInjectedClockDrivesRetransmits failed
// once under -race waiting for RETRY_EXC_ERR.
func TestFakeTimerFiresAtItsDeadlineAndAtOnceForThePast(t *testing.T) {
	c := NewFakeClock(time.Unix(100, 0))
	tm := c.NewTimer()
	fired := func() bool {
		select {
		case <-tm.C():
			return true
		default:
			return false
		}
	}
	tm.Reset(time.Second)
	c.Advance(time.Second - 1)
	require.False(t, fired(), "before the deadline")
	c.Advance(1)
	require.True(t, fired(), "at the deadline")
	c.Advance(time.Hour)
	require.False(t, fired(), "once")

	tm.Reset(time.Second)
	tm.Stop()
	c.Advance(time.Hour)
	require.False(t, fired(), "stopped")

	tm.Reset(0)
	require.True(t, fired(), "a Reset to now fires at once")
	tm.Reset(-time.Second)
	require.True(t, fired(), "so does one to the past")
	_, armed := c.NextDeadline()
	require.False(t, armed)

	tm.Reset(0)
	tm.Reset(time.Second) // a fresh arming drops the stale firing
	require.False(t, fired())
	c.Advance(time.Second)
	require.True(t, fired())
}
