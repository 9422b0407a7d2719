package cm

import "github.com/rxed/rxed/pkg/wire/mad"

// Disconnect sends a DREQ (ib_send_cm_dreq), retransmitted like the REQ or
// REP until the DREP; then EventDisconnected (Err ErrTimeout when none
// came) and TIMEWAIT. Valid in ESTABLISHED.
func (id *ID) Disconnect(privateData []byte) error {
	pd, err := clonePD(privateData, mad.DREQPrivateLen)
	if err != nil {
		return err
	}
	return id.do(func() error {
		if id.state != StateEstablished {
			return ErrState
		}
		id.m.sendDREQ(id, pd)
		return nil
	})
}

// sendDREQ is cm_send_dreq_locked; the TID is a fresh request's (our hi TID
// over our comm ID).
func (m *Manager) sendDREQ(id *ID, pd []byte) {
	if id.state != StateEstablished {
		return
	}
	dreq := &mad.DREQ{LocalCommID: id.localID, RemoteCommID: id.remoteID, RemoteQPN: id.remoteQPN, PrivateData: pd}
	b := m.marshal(m.formTID(id), dreq)
	if b == nil {
		m.enterTimewait(id)
		return
	}
	m.setState(id, StateDREQSent)
	wait := id.timeout
	if c := m.cfg.MaxDREQInterval; c > 0 && wait > c {
		wait = c
	}
	m.armRetransmit(id, b, wait, id.maxRetries, mad.AttrDREQ)
}

// onDREQ is cm_dreq_handler, with the DREP sent at once as rdma_cm does
// (cma_ib_handler answers IB_CM_DREQ_RECEIVED with ib_send_cm_drep).
func (m *Manager) onDREQ(r rx, dreq *mad.DREQ) {
	id := m.acquire(dreq.RemoteCommID, dreq.LocalCommID)
	if id == nil {
		// cm_issue_drep: answer anyway, so that a peer whose DREP got
		// lost after we left timewait stops retrying.
		m.count(cntUnknownComm)
		m.count("rx_dup_dreq")
		drep := &mad.DREP{LocalCommID: dreq.RemoteCommID, RemoteCommID: dreq.LocalCommID}
		if b := m.marshal(r.hdr.TID, drep); b != nil {
			m.sendMAD(r.src, r.dst, r.replyTraffic(), b)
		}
		return
	}
	if id.localQPN != dreq.RemoteQPN {
		m.count(cntBadDREQQPN)
		return
	}
	switch id.state {
	case StateREPSent, StateMRAREPRcvd:
		// The DREQ overtook a lost RTU. The peer sends one only from
		// ESTABLISHED, so the connection was made: say so before the
		// DREQ (cm.c delivers DREQ_RECEIVED alone, which rdma_cm
		// reports as DISCONNECTED, and librdmacm's synchronous
		// rdma_accept takes for success).
		m.establish(id, nil)
	case StateDREQSent:
		// A DREQ crossing ours ends the wait (cm_dreq_handler cancels
		// our DREQ): the DREP to ours may still come, in timewait.
		m.cancelRetransmit(id)
		id.dreqCrossed = true
	case StateEstablished:
	case StateTimewait:
		m.count("rx_dup_dreq")
		drep := &mad.DREP{LocalCommID: id.localID, RemoteCommID: id.remoteID, PrivateData: id.privateData}
		if b := m.marshal(id.tid, drep); b != nil {
			m.sendMAD(r.src, r.dst, r.replyTraffic(), b)
		}
		return
	case StateDREQRcvd:
		m.count("rx_dup_dreq")
		return
	default:
		m.count(cntWrongState)
		return
	}
	id.tid = r.hdr.TID
	m.setState(id, StateDREQRcvd)
	m.sendDREP(id, nil)
	m.emit(id, Event{Type: EventDREQ, PrivateData: dreq.PrivateData})
}

// sendDREP is cm_send_drep_locked: TIMEWAIT, then the DREP with the DREQ's
// TID.
func (m *Manager) sendDREP(id *ID, pd []byte) {
	id.privateData = pd
	m.enterTimewait(id)
	drep := &mad.DREP{LocalCommID: id.localID, RemoteCommID: id.remoteID, PrivateData: pd}
	if b := m.marshal(id.tid, drep); b != nil {
		m.sendMAD(id.remote, id.local, id.traffic, b)
	}
}

// onDREP is cm_drep_handler, plus one event cm.c does not give
// (crossedDREP).
func (m *Manager) onDREP(r rx, drep *mad.DREP) {
	id := m.acquire(drep.RemoteCommID, drep.LocalCommID)
	if id == nil {
		m.count(cntUnknownComm)
		return
	}
	if id.state == StateTimewait && id.dreqCrossed {
		m.crossedDREP(id, drep)
		return
	}
	if id.state != StateDREQSent && id.state != StateDREQRcvd {
		m.count("rx_dup_drep")
		return
	}
	m.enterTimewait(id)
	m.emit(id, Event{Type: EventDisconnected, PrivateData: drep.PrivateData})
}

// crossedDREP takes the DREP to our DREQ after crossed DREQs: we answered
// the peer's DREQ in DREQ_SENT and sit in timewait, where cm.c drops this
// DREP. It tells us that the peer owes and is owed nothing more: it had
// our DREQ, so its own was cancelled (cm_dreq_handler cancels the DREQ MAD
// of DREQ_SENT; cm_drep_handler, or the retries running out, had done so
// if it was in timewait already) and it will not retry it, and the DREP we
// sent it for that DREQ is needed by nobody. A consumer that outlives its
// CM only for the peer's retried DREQ (pkg/rdmacm's linger) can stop
// here; the ID stays in TIMEWAIT, answering stray DREQs, until
// EventTimewaitExit. Nothing is sent.
func (m *Manager) crossedDREP(id *ID, drep *mad.DREP) {
	id.dreqCrossed = false
	m.emit(id, Event{Type: EventCrossedDREP, PrivateData: drep.PrivateData})
}
