package daemon

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"time"
)

// errIdle ends a session whose QPs saw no traffic for the idle timeout.
var errIdle = errors.New("idle session reclaimed: no RoCE traffic on its QPs for the idle timeout")

// session is one perftest client's slot.
type session struct {
	peer     netip.Addr
	exchange string    // exchangeTCP or exchangeRDMACM (the metrics' label)
	start    time.Time // accepted (runSession)
	traffic  *sessionTraffic
	cancel   context.CancelCauseFunc
	// closeExchange, if set, closes the session's exchange connection
	// at once (safe beside the session's own use of it): a reclaimed
	// session answers nothing more, even a message already on its way.
	closeExchange func()

	// Guarded by registry.mu.
	established bool // the exchange is over: the idle timeout applies
	reaped      bool // idle found it once already
}

// registry admits sessions under the global and per-source limits and
// finds the idle ones.
//
// Locking: mu guards every field; it is never held across I/O.
type registry struct {
	mu        sync.Mutex
	max       int // sessions at once
	perSource int // sessions at once from one address (0: max)
	all       map[*session]struct{}
	bySource  map[netip.Addr]int
}

func newRegistry(max, perSource int) *registry {
	return &registry{max: max, perSource: perSource, all: map[*session]struct{}{}, bySource: map[netip.Addr]int{}}
}

// admit takes a slot for s, or reports false when the daemon (or s's
// source) is at its limit.
func (r *registry) admit(s *session) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.all) >= r.max || (r.perSource > 0 && r.bySource[s.peer] >= r.perSource) {
		return false
	}
	r.all[s] = struct{}{}
	r.bySource[s.peer]++
	return true
}

// release frees s's slot.
func (r *registry) release(s *session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.all[s]; !ok {
		return
	}
	delete(r.all, s)
	if r.bySource[s.peer]--; r.bySource[s.peer] <= 0 {
		delete(r.bySource, s.peer)
	}
}

// establish starts s's idle clock at now.
func (r *registry) establish(s *session, now time.Time) {
	s.traffic.lastRx.Store(now.UnixNano())
	r.mu.Lock()
	s.established = true
	r.mu.Unlock()
}

// idle returns the established sessions whose QPs have been silent for
// at least timeout at now.
func (r *registry) idle(now time.Time, timeout time.Duration) []*session {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*session
	for s := range r.all {
		if s.established && !s.reaped && now.Sub(time.Unix(0, s.traffic.lastRx.Load())) >= timeout {
			s.reaped = true
			out = append(out, s)
		}
	}
	return out
}

// count is the number of sessions holding a slot.
func (r *registry) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.all)
}

// allowed reports whether addr may use the exchange (an empty allowlist
// allows every address).
func allowed(allow []netip.Prefix, addr netip.Addr) bool {
	if len(allow) == 0 {
		return true
	}
	addr = addr.Unmap()
	for _, p := range allow {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}
