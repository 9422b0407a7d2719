package conform

import (
	"errors"
	"net"
	"net/netip"
	"sync"
)

// scope is everything one scenario holds that must not outlive it: the
// tool's exchange listener (the TCP port the peer's client connects to),
// the exchange's TCP session, the UDP link (the RoCE port) and the
// goroutine that waits for the tool's end.
//
// Run owns the scope, not the scenario body. Accept and Dial open each of
// these through it, and Run closes them all before it returns, whether the
// body returned or overran its deadline and is still running: a scenario
// that ignores its context must not keep a port the next scenario binds
// (the next one would fail with "address already in use"). The listener is
// held only until the scenario's context ends (expire): past the deadline
// the accept phase has failed anyway.
//
// Locking: mu guards every field. open runs the opening itself under mu,
// so once end has returned nothing can be opened any more: a late body's
// bind fails with errScopeEnded instead of taking the port from the next
// scenario. A nil *scope holds nothing (Accept and Dial called directly:
// Conn.Close then closes everything, as before).
type scope struct {
	mu      sync.Mutex
	expired bool // the scenario's context ended: listeners are closed
	ended   bool // end ran: everything is closed, nothing may be opened
	held    []holding
	// link is the scenario's UDP link, for the trace of a scenario that
	// overran (its body still has the Conn).
	link *Link
}

// holding is one thing a scenario holds; untilDeadline things (the
// exchange's listener) are closed as soon as the scenario's context ends.
type holding struct {
	close         func()
	untilDeadline bool
}

// errScopeEnded is what a late body gets when it opens something after
// the runner took back its scenario's resources.
var errScopeEnded = errors.New("the scenario overran its deadline: the runner has closed its connection")

// open calls opener under the scope's lock unless the scope has ended
// (or, for untilDeadline, expired), and holds the close function it
// returns.
func (s *scope) open(untilDeadline bool, opener func() (close func(), err error)) error {
	if s == nil {
		_, err := opener()
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended || (untilDeadline && s.expired) {
		return errScopeEnded
	}
	c, err := opener()
	if err != nil {
		return err
	}
	s.held = append(s.held, holding{close: c, untilDeadline: untilDeadline})
	return nil
}

// hold takes something already open (an accepted session, a goroutine's
// cancel); when the scope has ended it is closed at once and hold returns
// errScopeEnded.
func (s *scope) hold(close func()) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		close()
		return errScopeEnded
	}
	s.held = append(s.held, holding{close: close})
	s.mu.Unlock()
	return nil
}

// openLink opens the scenario's UDP link through the scope.
func (s *scope) openLink(local, peer netip.AddrPort) (*Link, error) {
	var l *Link
	err := s.open(false, func() (func(), error) {
		var err error
		if l, err = OpenLink(local, peer); err != nil {
			return nil, err
		}
		if s != nil {
			s.link = l
		}
		return func() { _ = l.Close() }, nil
	})
	return l, err
}

// expire closes what is held only until the deadline (the listener).
func (s *scope) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expired = true
	kept := s.held[:0]
	for i := len(s.held) - 1; i >= 0; i-- {
		if s.held[i].untilDeadline {
			s.held[i].close()
		}
	}
	for _, h := range s.held {
		if !h.untilDeadline {
			kept = append(kept, h)
		}
	}
	s.held = kept
}

// end closes everything still held, the last opened first; it is
// idempotent and, when it returns, every port is free and the link's and
// the tool waiter's goroutines have ended.
func (s *scope) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expired, s.ended = true, true
	for i := len(s.held) - 1; i >= 0; i-- {
		s.held[i].close()
	}
	s.held = nil
}

// scenarioLink is the link the scenario opened, if any.
func (s *scope) scenarioLink() *Link {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.link
}

// listening is called with the exchange listener's address once it
// listens: a test hook, so that a fake peer's client connects on that
// event (and a test can stall an accept phase), not after a sleep.
var listening = func(net.Addr) {}
