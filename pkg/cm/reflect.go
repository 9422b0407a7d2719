package cm

import "time"

// A REQ's source address cannot be trusted: anyone who can send to QP 1
// can forge it. cm.c retransmits the REP as often and as fast as the REQ
// asks (up to 15 times, CMTimeout(0) = 1 ms apart), so one forged REQ
// made a listener that accepts (any rdma_cm server, rxed serve
// --rdma-cm-port) send 16 MADs of the same size to a third party: a 16x
// reflector.
//
// Until the peer answers (the RTU, or Established), each REQ received
// pays for 3 REPs (QUIC's anti-amplification factor, RFC 9000 section
// 8): the first and 2 retransmissions; a duplicate REQ is answered at
// once and pays for 2 more. Retransmissions past that come from one
// allowance shared by the Manager (spareREPRate a second, spareREPBurst
// at most), so a peer whose REP or RTU is lost again and again keeps
// cm.c's schedule while nobody floods, and a flood of forged REQs gets
// 3 REPs each plus that small constant rate in all. A retransmission
// neither pays for is skipped (counted as rep_retries_limited) and the
// schedule goes on: a later one, or a duplicate REQ, may still be sent,
// and the REP times out when cm.c's would.
const (
	repsPerREQ     = 3
	spareREPRate   = 16 // a second
	spareREPBurst  = 32
	spareREPPeriod = time.Second / spareREPRate
)

// allowance is a token bucket on the Manager's clock.
type allowance struct {
	tokens int
	at     time.Time // when tokens was last refilled (zero: full)
}

func (a *allowance) take(now time.Time) bool {
	if a.at.IsZero() {
		a.tokens, a.at = spareREPBurst, now
	}
	if n := int(now.Sub(a.at) / spareREPPeriod); n > 0 {
		a.tokens = min(spareREPBurst, a.tokens+n)
		a.at = a.at.Add(time.Duration(n) * spareREPPeriod)
		if a.tokens == spareREPBurst {
			a.at = now
		}
	}
	if a.tokens == 0 {
		return false
	}
	a.tokens--
	return true
}

// mayResend reports whether out may be retransmitted now, and charges it.
func (m *Manager) mayResend(out *retransmit) bool {
	switch {
	case out.free < 0:
		return true
	case out.free > 0:
		out.free--
		return true
	}
	return m.spareREPs.take(m.clock.Now())
}
