package cm

import (
	"github.com/rxed/rxed/pkg/wire/mad"
)

// Listener receives the REQs and SIDR_REQs whose service ID matches it.
type Listener struct {
	m       *Manager
	service uint64
	mask    uint64
	handler Handler
}

// Listen registers h for REQs and SIDR_REQs whose service ID s satisfies
// s&mask == serviceID&mask; mask 0 means an exact match (as ib_cm_listen).
// h receives EventREQ / EventSIDRREQ for each new ID and, until the
// consumer calls ID.SetHandler, all that ID's later events.
func (m *Manager) Listen(serviceID, mask uint64, h Handler) (*Listener, error) {
	if mask == 0 {
		mask = ^uint64(0)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	l := &Listener{m: m, service: serviceID & mask, mask: mask, handler: h}
	for _, o := range m.listeners {
		// Two listeners overlap when some service ID matches both.
		if (l.service^o.service)&(l.mask&o.mask) == 0 {
			return nil, ErrBusy
		}
	}
	m.listeners = append(m.listeners, l)
	return l, nil
}

// Close stops the listener; IDs it created live on.
func (l *Listener) Close() error {
	m := l.m
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, o := range m.listeners {
		if o == l {
			m.listeners = append(m.listeners[:i], m.listeners[i+1:]...)
			return nil
		}
	}
	return nil
}

func (m *Manager) findListener(service uint64) *Listener {
	for _, l := range m.listeners {
		if service&l.mask == l.service {
			return l
		}
	}
	return nil
}

// onREQ is cm_req_handler with cm_match_req: duplicate, then stale, then
// listener, then resources.
func (m *Manager) onREQ(r rx, req *mad.REQ) {
	if cur := m.remoteIDs[remoteKey{req.LocalCAGUID, req.LocalCommID}]; cur != nil {
		m.dupREQ(r, cur)
		return
	}
	if cur := m.remoteQPs[remoteQPKey{req.LocalCAGUID, req.LocalQPN}]; cur != nil {
		// The peer reuses a QPN we still hold a connection (or its
		// timewait) for: refuse the REQ, and end our connection, which
		// the peer has evidently forgotten.
		m.count(cntRejStale)
		m.issueREJ(r, mad.REJStaleConn, mad.REJMsgREQ, nil)
		if cur.state == StateEstablished {
			m.sendDREQ(cur, nil)
		}
		return
	}
	l := m.findListener(req.ServiceID)
	if l == nil {
		m.count(cntRejNoListen)
		m.issueREJ(r, mad.REJInvalidServiceID, mad.REJMsgREQ, nil)
		return
	}
	if m.halfOpen >= m.cfg.MaxHalfOpen {
		m.count(cntRejNoRes)
		m.issueREJ(r, mad.REJNoResources, mad.REJMsgREQ, nil)
		return
	}
	id := m.newID(l.handler)
	id.passive = true
	id.remoteID = req.LocalCommID
	id.remoteGUID = req.LocalCAGUID
	id.remoteQPN = req.LocalQPN
	id.service = req.ServiceID
	id.tid = r.hdr.TID
	id.local, id.remote = r.dst, r.src
	// cm_req_handler's AV: the REQ's primary path with the hop limit of
	// the AV it first built from the work completion, the route's.
	id.traffic = Traffic{TrafficClass: req.Primary.TrafficClass, HopLimit: RouteHopLimit}
	// The passive side answers within the active side's response
	// timeout and retries as often as the active side does.
	id.timeout = CMTimeout(req.LocalCMResponseTimeout)
	id.maxRetries = int(req.MaxCMRetries)
	// cm_init_av_by_path on the path from the REQ: packet life time is
	// the REQ's local ACK timeout - 1, and av.timeout that + 1.
	id.avTimeout = max(req.Primary.LocalACKTimeout, 1)
	m.insertRemoteID(id)
	m.insertRemoteQP(id)
	m.setState(id, StateREQRcvd)
	m.emit(id, Event{Type: EventREQ, REQ: req, PrivateData: req.PrivateData})
	// rdma_cm arms its delayed MRA once its REQ handler has returned
	// (cma_ib_req_handler): a REQ refused from inside the handler is
	// refused from REQ_RCVD, whose REJ names no local comm ID.
	m.after(func() { m.prepareMRA(id) })
}

// PrepareMRA is ib_prepare_cm_mra (ib_send_cm_mra with
// IB_CM_MRA_FLAG_DELAY): the consumer will take a while to answer the REQ
// (or REP) it was given. Nothing is sent now; the ID moves to MRA_REQ_SENT
// (MRA_REP_SENT), where a duplicate REQ (REP) is answered with an MRA of
// Config.MRAServiceTimeout. The Manager does it itself once the EventREQ
// handler has returned and before it delivers EventREP, as rdma_cm does;
// a consumer that hands the request on to another goroutine calls it
// first, so that what that goroutine answers leaves from MRA_REQ_SENT
// whichever runs first. Valid in REQ_RCVD and REP_RCVD; nil when the MRA
// is armed already.
func (id *ID) PrepareMRA() error {
	return id.do(func() error {
		switch id.state {
		case StateMRAREQSent, StateMRAREPSent:
			return nil
		}
		if !id.m.prepareMRA(id) {
			return ErrState
		}
		return nil
	})
}

// prepareMRA is ib_prepare_cm_mra's step: REQ_RCVD to MRA_REQ_SENT,
// REP_RCVD to MRA_REP_SENT. It reports whether the ID moved.
func (m *Manager) prepareMRA(id *ID) bool {
	if id.freed {
		return false
	}
	switch id.state {
	case StateREQRcvd:
		m.setState(id, StateMRAREQSent)
	case StateREPRcvd:
		m.setState(id, StateMRAREPSent)
	default:
		return false
	}
	id.serviceTimeout = m.cfg.MRAServiceTimeout
	return true
}

// dupREQ is cm_dup_req_handler, plus a REP resend in REP_SENT (IBA
// 12.9.6: cm.c drops the duplicate and relies on the REP's own timer).
func (m *Manager) dupREQ(r rx, id *ID) {
	m.count("rx_dup_req")
	switch id.state {
	case StateMRAREQSent:
		mra := &mad.MRA{LocalCommID: id.localID, RemoteCommID: id.remoteID,
			MessageMRAed: mad.MRAMsgREQ, ServiceTimeout: id.serviceTimeout, PrivateData: id.privateData}
		if b := m.marshal(id.tid, mra); b != nil {
			m.sendMAD(r.src, r.dst, r.replyTraffic(), b)
		}
	case StateREPSent, StateMRAREPRcvd:
		if id.out != nil {
			// The REP again, on the ID's AV as the first one.
			m.sendMAD(r.src, r.dst, id.traffic, id.out.mad)
			if id.out.free >= 0 {
				id.out.free += repsPerREQ - 1
			}
		}
	case StateTimewait:
		m.count(cntRejStale)
		m.sendMAD(r.src, r.dst, r.replyTraffic(), m.formatREJ(id, StateTimewait, mad.REJStaleConn, nil, nil))
	}
}

// AcceptParams is what the passive side puts in its REP (ib_cm_rep_param).
type AcceptParams struct {
	QPN         uint32 // 24 bits
	QKey        uint32 // UD/RD only
	StartingPSN uint32 // 24 bits: the PSN we receive from first (our rq_psn, as in Linux's ib_cm)
	// ResponderResources and InitiatorDepth: the REQ's initiator depth
	// and responder resources, at most (rdma_cm swaps and clamps them).
	ResponderResources uint8
	InitiatorDepth     uint8
	FailoverAccepted   uint8 // 2 bits
	FlowControl        bool
	RNRRetryCount      uint8 // 3 bits
	SRQ                bool
	PrivateData        []byte // at most mad.REPPrivateLen
}

// Accept sends the REP (ib_send_cm_rep) and retransmits it until the RTU
// arrives or Established is called; unanswered, EventTimeout follows.
// Valid after EventREQ, before Reject.
func (id *ID) Accept(p AcceptParams) error {
	pd, err := clonePD(p.PrivateData, mad.REPPrivateLen)
	if err != nil {
		return err
	}
	if p.QPN > mad.MaxQPN || p.StartingPSN > mad.MaxQPN || p.FailoverAccepted > 3 || p.RNRRetryCount > 7 {
		return ErrInvalid
	}
	return id.do(func() error {
		m := id.m
		if id.state != StateREQRcvd && id.state != StateMRAREQSent {
			return ErrState
		}
		rep := &mad.REP{
			LocalCommID: id.localID, RemoteCommID: id.remoteID,
			LocalQKey: p.QKey, LocalQPN: p.QPN, StartingPSN: p.StartingPSN,
			ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
			TargetACKDelay: m.cfg.CAAckDelay, FailoverAccepted: p.FailoverAccepted,
			EndToEndFlowControl: p.FlowControl, RNRRetryCount: p.RNRRetryCount, SRQ: p.SRQ,
			LocalCAGUID: m.cfg.NodeGUID, PrivateData: pd,
		}
		b, err := mad.Marshal(id.tid, rep)
		if err != nil {
			return ErrInvalid
		}
		id.localQPN = p.QPN
		id.privateData = nil
		m.setState(id, StateREPSent)
		m.armRetransmit(id, b, id.timeout, id.maxRetries, mad.AttrREP)
		id.out.free = repsPerREQ - 1 // the REQ paid for this one and 2 more
		return nil
	})
}

// Established tells the CM that the QP received traffic from the peer
// before the RTU (ib_cm_notify IB_EVENT_COMM_EST, which pkg/rdmacm calls
// on the QP's COMM_EST event): the connection is up, the REP stops, and
// a late RTU (or our REP, retransmitted before and answered by the
// peer's RTU again) is a duplicate. On an ID that is ESTABLISHED already
// (the RTU came first, or a second notification) it does nothing and
// returns ErrAlreadyEstablished, as cm_establish returns -EISCONN (which
// rdma_notify passes on and the kernel's ULPs ignore); before the REP or
// after the connection ended, ErrState (cm_establish's -EINVAL).
func (id *ID) Established() error {
	return id.do(func() error {
		switch id.state {
		case StateREPSent, StateMRAREPRcvd:
			id.m.count(cntCommEst)
			id.m.establish(id, nil)
			return nil
		case StateEstablished:
			return ErrAlreadyEstablished
		}
		return ErrState
	})
}

// establish is cm_establish with the work it queues
// (cm_establish_handler), and cm_rtu_handler's step: a passive ID in
// REP_SENT or MRA_REP_RCVD is connected, its REP stops being
// retransmitted, and the consumer hears EventEstablished (rdma_cm's
// ESTABLISHED for IB_CM_RTU_RECEIVED and IB_CM_USER_ESTABLISHED alike).
// pd is the RTU's private data, nil for the others.
func (m *Manager) establish(id *ID, pd []byte) {
	m.cancelRetransmit(id)
	m.setState(id, StateEstablished)
	m.emit(id, Event{Type: EventEstablished, PrivateData: pd})
}

// onRTU is cm_rtu_handler.
func (m *Manager) onRTU(r rx, rtu *mad.RTU) {
	id := m.acquire(rtu.RemoteCommID, rtu.LocalCommID)
	if id == nil {
		m.count(cntUnknownComm)
		return
	}
	if id.state != StateREPSent && id.state != StateMRAREPRcvd {
		m.count("rx_dup_rtu")
		return
	}
	m.establish(id, rtu.PrivateData)
}
