package roce

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The process's alarm is a timerfd that its arm function sets, one shot,
// for the wait asked (0 is not "disarm": the shortest wait instead).
func TestIdleWakerAlarmIsATimerfd(t *testing.T) {
	require.NotNil(t, systemWaker(), "Linux has timerfd")
	rc, err := idleWakeFile.SyscallConn()
	require.NoError(t, err)
	remaining := func() (v unix.ItimerSpec) {
		t.Helper()
		require.NoError(t, rc.Control(func(fd uintptr) { require.NoError(t, unix.TimerfdGettime(int(fd), &v)) }))
		return v
	}
	require.NoError(t, processWaker.arm(50*time.Millisecond))
	v := remaining()
	left := time.Duration(unix.TimespecToNsec(v.Value))
	require.Greater(t, left, time.Duration(0))
	require.LessOrEqual(t, left, 50*time.Millisecond)
	require.Zero(t, unix.TimespecToNsec(v.Interval), "one shot")

	require.NoError(t, processWaker.arm(0))
	for left := time.Duration(1); left > 0; left = time.Duration(unix.TimespecToNsec(remaining().Value)) {
		// Armed for 1 ns: expired at once, not disarmed (a disarmed
		// timerfd never expires; this loop ends because it did).
	}
	var n [8]byte
	require.NoError(t, rc.Control(func(fd uintptr) {
		_, err := unix.Read(int(fd), n[:])
		require.NoError(t, err, "the expiry is counted")
	}))
}
