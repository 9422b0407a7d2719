package roce

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// newIdleWaker returns the process's idle waker, its alarm a timerfd that
// the netpoller watches: os.NewFile registers a non-blocking descriptor
// with it (edge-triggered, so every expiry wakes a thread asleep in
// epoll_pwait, and nothing needs to read the count). nil if the timerfd
// cannot be made.
func newIdleWaker() *idleWaker {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(fd), "rxed-idle-wake")
	idleWakeFile = f // the registration lives as long as the file
	return &idleWaker{arm: func(d time.Duration) error {
		v := unix.ItimerSpec{Value: unix.NsecToTimespec(max(int64(d), 1))} // 0 would disarm it
		return unix.TimerfdSettime(fd, 0, &v, nil)
	}}
}

// idleWakeFile keeps the alarm's file (and its descriptor) open.
var idleWakeFile *os.File
