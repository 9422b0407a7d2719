//go:build !linux

package roce

// newIdleWaker: no alarm the netpoller watches on this platform; the
// runtime's own timer rounding stays.
func newIdleWaker() *idleWaker { return nil }
