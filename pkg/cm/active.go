package cm

import (
	"net/netip"

	"github.com/rxed/rxed/pkg/wire/mad"
)

// ConnectParams is the active side's REQ (ib_cm_req_param plus the path).
// Zero values of the fields marked so take the default rdma_cm uses.
type ConnectParams struct {
	// Src is our GID (the REQ's primary local GID, the MAD's source);
	// Dst the peer's.
	Src, Dst  netip.Addr
	ServiceID uint64

	QPN           uint32 // 24 bits
	QKey          uint32 // UD/RD only
	StartingPSN   uint32 // 24 bits: the PSN we receive from first (our rq_psn, as in Linux's ib_cm); Manager.NewPSN draws one
	TransportType uint8  // mad.TransportRC (0) or mad.TransportUC
	// ResponderResources and InitiatorDepth as offered in the REQ.
	ResponderResources uint8
	InitiatorDepth     uint8
	FlowControl        bool
	RetryCount         uint8 // 3 bits
	RNRRetryCount      uint8 // 3 bits
	SRQ                bool
	PKey               uint16 // 0: 0xFFFF
	PathMTU            uint8  // IBA MTU encoding; 0: 3 (1024)

	// Path: packet life time (IBA time value; 0: 16, rdma_cm's
	// CMA_IBOE_PACKET_LIFETIME for RoCE), flow label, traffic class, hop
	// limit (0: 64), SL, packet rate. A hop limit above 1 puts 0xFFFF
	// (permissive) in both LIDs, as cm.c does on routed RoCE.
	PacketLifeTime uint8
	FlowLabel      uint32
	TrafficClass   uint8
	HopLimit       uint8
	SL             uint8
	PacketRate     uint8

	// CM timing (IBA time values): 0 means 20 (about 4.3 s), rdma_cm's
	// CMA_CM_RESPONSE_TIMEOUT. MaxCMRetries 0 means 15.
	LocalCMResponseTimeout  uint8
	RemoteCMResponseTimeout uint8
	MaxCMRetries            uint8

	PrivateData []byte // at most mad.REQPrivateLen

	// AutoRTU: on the REP, the Manager sends the RTU itself before
	// delivering EventREP (then EventEstablished). Otherwise the handler
	// calls ID.SendRTU after moving its QP to RTR/RTS (rdma_cm's flow).
	AutoRTU bool
}

func (p *ConnectParams) defaults() {
	if p.PKey == 0 {
		p.PKey = 0xFFFF
	}
	if p.PathMTU == 0 {
		p.PathMTU = 3
	}
	if p.PacketLifeTime == 0 {
		p.PacketLifeTime = 16
	}
	if p.HopLimit == 0 {
		p.HopLimit = 64
	}
	if p.LocalCMResponseTimeout == 0 {
		p.LocalCMResponseTimeout = 20
	}
	if p.RemoteCMResponseTimeout == 0 {
		p.RemoteCMResponseTimeout = 20
	}
	if p.MaxCMRetries == 0 {
		p.MaxCMRetries = 15
	}
}

// Connect sends a REQ (ib_send_cm_req) and returns the new ID in REQ_SENT.
// The REQ is retransmitted every 2 x packet life time + remote CM response
// timeout (cm.c's timeout_ms) up to MaxCMRetries times; then EventTimeout.
func (m *Manager) Connect(p ConnectParams, h Handler) (*ID, error) {
	p.defaults()
	pd, err := clonePD(p.PrivateData, mad.REQPrivateLen)
	if err != nil {
		return nil, err
	}
	if !p.Src.IsValid() || !p.Dst.IsValid() || p.PacketLifeTime > 31 || p.MaxCMRetries > 15 {
		return nil, ErrInvalid
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	id := m.newID(h)
	id.service = p.ServiceID
	id.local, id.remote = p.Src, p.Dst
	id.localQPN = p.QPN
	id.traffic = Traffic{TrafficClass: p.TrafficClass, HopLimit: p.HopLimit}
	id.autoRTU = p.AutoRTU
	id.timeout = 2*CMTimeout(p.PacketLifeTime) + CMTimeout(p.RemoteCMResponseTimeout)
	id.maxRetries = int(p.MaxCMRetries)
	id.avTimeout = p.PacketLifeTime + 1
	id.tid = m.formTID(id)
	path := mad.Path{
		LocalGID: p.Src, RemoteGID: p.Dst,
		FlowLabel: p.FlowLabel, PacketRate: p.PacketRate, TrafficClass: p.TrafficClass,
		HopLimit: p.HopLimit, SL: p.SL, SubnetLocal: p.HopLimit <= 1,
		LocalACKTimeout: ackTimeout(m.cfg.CAAckDelay, p.PacketLifeTime),
	}
	if p.HopLimit > 1 {
		path.LocalLID, path.RemoteLID = 0xFFFF, 0xFFFF
	}
	req := &mad.REQ{
		LocalCommID: id.localID, ServiceID: p.ServiceID, LocalCAGUID: m.cfg.NodeGUID,
		LocalQKey: p.QKey, LocalQPN: p.QPN,
		ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
		RemoteCMResponseTimeout: p.RemoteCMResponseTimeout, TransportType: p.TransportType,
		EndToEndFlowControl: p.FlowControl, StartingPSN: p.StartingPSN,
		LocalCMResponseTimeout: p.LocalCMResponseTimeout, RetryCount: p.RetryCount,
		PKey: p.PKey, PathMTU: p.PathMTU, RNRRetryCount: p.RNRRetryCount,
		MaxCMRetries: p.MaxCMRetries, SRQ: p.SRQ, Primary: path, PrivateData: pd,
	}
	b, err := mad.Marshal(id.tid, req)
	if err != nil {
		delete(m.ids, id.localID)
		m.mu.Unlock()
		return nil, ErrInvalid
	}
	m.setState(id, StateREQSent)
	m.armRetransmit(id, b, id.timeout, id.maxRetries, mad.AttrREQ)
	m.mu.Unlock()
	m.drain()
	return id, nil
}

// onREP is cm_rep_handler.
func (m *Manager) onREP(r rx, rep *mad.REP) {
	id := m.acquire(rep.RemoteCommID, 0)
	if id == nil {
		m.dupREP(r, rep)
		return
	}
	if id.state != StateREQSent && id.state != StateMRAREQRcvd {
		m.count(cntWrongState)
		return
	}
	id.remoteID = rep.LocalCommID
	id.remoteGUID = rep.LocalCAGUID
	id.remoteQPN = rep.LocalQPN
	if !m.insertRemoteID(id) {
		// Another ID already talks to this peer comm ID.
		id.remoteID, id.remoteGUID, id.remoteQPN = 0, 0, 0
		m.count(cntWrongState)
		return
	}
	if cur := m.insertRemoteQP(id); cur != nil {
		m.removeRemote(id)
		id.remoteID, id.remoteGUID, id.remoteQPN = 0, 0, 0
		m.count(cntRejStale)
		m.issueREJ(r, mad.REJStaleConn, mad.REJMsgREP, nil)
		if cur.state == StateEstablished {
			m.sendDREQ(cur, nil)
		}
		return
	}
	m.cancelRetransmit(id)
	id.avTimeout = ackTimeout(rep.TargetACKDelay, max(id.avTimeout, 1)-1)
	m.setState(id, StateREPRcvd)
	if id.autoRTU {
		m.emit(id, Event{Type: EventREP, REP: rep, PrivateData: rep.PrivateData})
		m.sendRTU(id, nil)
		return
	}
	// rdma_cm arms a delayed MRA on the REP too, before it tells the
	// application (cma_ib_handler).
	m.prepareMRA(id)
	m.emit(id, Event{Type: EventREP, REP: rep, PrivateData: rep.PrivateData})
}

// dupREP is cm_dup_rep_handler: a REP for an ID that already has the
// peer's comm ID.
func (m *Manager) dupREP(r rx, rep *mad.REP) {
	id := m.acquire(rep.RemoteCommID, rep.LocalCommID)
	if id == nil {
		m.count(cntUnknownComm)
		return
	}
	m.count("rx_dup_rep")
	switch id.state {
	case StateEstablished:
		rtu := &mad.RTU{LocalCommID: id.localID, RemoteCommID: id.remoteID, PrivateData: id.privateData}
		if b := m.marshal(id.tid, rtu); b != nil {
			m.sendMAD(r.src, r.dst, r.replyTraffic(), b)
		}
	case StateMRAREPSent:
		mra := &mad.MRA{LocalCommID: id.localID, RemoteCommID: id.remoteID,
			MessageMRAed: mad.MRAMsgREP, ServiceTimeout: id.serviceTimeout, PrivateData: id.privateData}
		if b := m.marshal(id.tid, mra); b != nil {
			m.sendMAD(r.src, r.dst, r.replyTraffic(), b)
		}
	}
}

// SendRTU sends the RTU (ib_send_cm_rtu): the ID is ESTABLISHED and
// EventEstablished follows. Valid after EventREP.
func (id *ID) SendRTU(privateData []byte) error {
	pd, err := clonePD(privateData, mad.RTUPrivateLen)
	if err != nil {
		return err
	}
	return id.do(func() error {
		if id.state != StateREPRcvd && id.state != StateMRAREPSent {
			return ErrState
		}
		id.m.sendRTU(id, pd)
		return nil
	})
}

func (m *Manager) sendRTU(id *ID, pd []byte) {
	rtu := &mad.RTU{LocalCommID: id.localID, RemoteCommID: id.remoteID, PrivateData: pd}
	if b := m.marshal(id.tid, rtu); b != nil {
		m.sendMAD(id.remote, id.local, id.traffic, b)
	}
	id.privateData = pd
	m.setState(id, StateEstablished)
	m.emit(id, Event{Type: EventEstablished})
}

// onMRA is cm_mra_handler with cm_acquire_mraed_id.
func (m *Manager) onMRA(r rx, mra *mad.MRA) {
	var id *ID
	switch mra.MessageMRAed {
	case mad.MRAMsgREQ:
		id = m.acquire(mra.RemoteCommID, 0)
	case mad.MRAMsgREP, mad.MRAMsgLAP:
		id = m.acquire(mra.RemoteCommID, mra.LocalCommID)
	}
	if id == nil {
		m.count(cntUnknownComm)
		return
	}
	timeout := CMTimeout(mra.ServiceTimeout) + CMTimeout(id.avTimeout)
	switch {
	case id.state == StateREQSent && mra.MessageMRAed == mad.MRAMsgREQ:
		m.setState(id, StateMRAREQRcvd)
	case id.state == StateREPSent && mra.MessageMRAed == mad.MRAMsgREP:
		m.setState(id, StateMRAREPRcvd)
	case id.state == StateMRAREQRcvd || id.state == StateMRAREPRcvd:
		m.count("rx_dup_mra")
		return
	default:
		m.count(cntWrongState)
		return
	}
	m.modifyRetransmit(id, timeout)
	m.emit(id, Event{Type: EventMRA, ServiceTimeout: mra.ServiceTimeout, PrivateData: mra.PrivateData})
}
