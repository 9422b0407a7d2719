package cm

import "time"

// CMTimeout converts an IBA time value t (4.096 us x 2^t) to the duration
// cm.c waits for it: cm_convert_to_ms, 1 << max(t-8, 0) ms. The
// approximation is the kernel's, and our peers time out by it.
func CMTimeout(t uint8) time.Duration {
	e := int(t) - 8
	if e < 0 {
		e = 0
	}
	if e > 31 {
		e = 31
	}
	return time.Duration(1<<e) * time.Millisecond
}

// ackTimeout is cm.c's cm_ack_timeout: the local ACK timeout for a path of
// packet life time lifeTime through a CA with ACK delay caAckDelay,
// 4.096 us x 2^ack = 4.096 us x 2^delay + 2 x 4.096 us x 2^life, rounded as
// the kernel rounds: the larger of delay and life+1, plus one when the
// other is within a factor of two.
func ackTimeout(caAckDelay, lifeTime uint8) uint8 {
	t := int(lifeTime) + 1
	d := int(caAckDelay)
	if t >= d {
		if d >= t-1 {
			t++
		}
	} else {
		if t >= d-1 {
			t = d + 1
		} else {
			t = d
		}
	}
	return uint8(min(31, t))
}

// retransmit is the one message an ID may have outstanding (cm.c's
// cm_id_priv->msg): it is sent again every timeout until retries run out,
// then the ID's state decides what the timeout means (sendError).
type retransmit struct {
	mad     []byte
	timeout time.Duration
	retries int // sends left after the first
	// free, for a REP, is how many more sends the REQs received have
	// paid for (reflect.go); -1 for every other message: no bound.
	free     int
	timer    Timer
	attrName string
}

// armRetransmit sends b now and arms its retransmission.
func (m *Manager) armRetransmit(id *ID, b []byte, timeout time.Duration, retries int, attr uint16) {
	m.cancelRetransmit(id)
	id.out = &retransmit{mad: b, timeout: timeout, retries: retries, free: -1, attrName: msgName(attr)}
	m.sendMAD(id.remote, id.local, id.traffic, b)
	m.startRetransmitTimer(id, timeout)
}

func (m *Manager) startRetransmitTimer(id *ID, d time.Duration) {
	id.gen++
	gen := id.gen
	out := id.out
	if out.timer != nil {
		out.timer.Stop()
	}
	out.timer = m.clock.AfterFunc(d, func() { m.onRetransmitTimer(id, gen) })
}

// cancelRetransmit is ib_cancel_mad.
func (m *Manager) cancelRetransmit(id *ID) {
	if id.out == nil {
		return
	}
	id.gen++
	if id.out.timer != nil {
		id.out.timer.Stop()
	}
	id.out = nil
}

// modifyRetransmit is ib_modify_mad: the current wait and every later one
// last timeout (an MRA's service timeout plus the packet life time).
func (m *Manager) modifyRetransmit(id *ID, timeout time.Duration) bool {
	if id.out == nil {
		return false
	}
	id.out.timeout = timeout
	m.startRetransmitTimer(id, timeout)
	return true
}

func (m *Manager) onRetransmitTimer(id *ID, gen uint64) {
	m.mu.Lock()
	if m.closed || id.freed || id.gen != gen || id.out == nil {
		m.mu.Unlock()
		return
	}
	out := id.out
	if out.retries > 0 {
		out.retries--
		if m.mayResend(out) {
			m.count("tx_retries_" + out.attrName)
			m.sendMAD(id.remote, id.local, id.traffic, out.mad)
		} else {
			m.count(cntREPRetriesLimited)
		}
		m.startRetransmitTimer(id, out.timeout)
	} else {
		id.out = nil
		m.count(cntTimeouts)
		m.sendError(id)
	}
	m.mu.Unlock()
	m.drain()
}

// sendError is cm_process_send_error: the outstanding message went
// unanswered.
func (m *Manager) sendError(id *ID) {
	switch id.state {
	case StateREQSent, StateMRAREQRcvd, StateREPSent, StateMRAREPRcvd:
		m.free(id)
		m.emit(id, Event{Type: EventTimeout, Reason: reasonTimeout, Err: ErrTimeout})
	case StateDREQSent:
		m.enterTimewait(id)
		m.emit(id, Event{Type: EventDisconnected, Err: ErrTimeout})
	case StateSIDRREQSent:
		m.free(id)
		h := id.sidrHandler
		m.outbox = append(m.outbox, action{sidr: func() { h(SIDRResult{Err: ErrTimeout}) }})
	}
}
