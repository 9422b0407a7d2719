package cm

import (
	"net/netip"
	"slices"
	"time"

	"github.com/rxed/rxed/pkg/wire/mad"
)

// SIDRParams is a SIDR_REQ (ib_cm_sidr_req_param).
type SIDRParams struct {
	Src, Dst    netip.Addr
	ServiceID   uint64
	PKey        uint16 // 0: 0xFFFF
	PrivateData []byte // at most mad.SIDRREQPrivateLen (rdma_cm: its header first)
	// Timeout per try (0: 4096 ms, rdma_cm's 1 << (CMA_CM_RESPONSE_TIMEOUT
	// - 8)) and retries (0: 15).
	Timeout      time.Duration
	MaxCMRetries uint8
	// TrafficClass and HopLimit (0: RouteHopLimit) are the path's, which
	// the SIDR_REQs leave with (ib_send_cm_sidr_req's cm_init_av_by_path;
	// rdma_cm's path carries the ID's TOS on RoCE).
	TrafficClass, HopLimit uint8
}

// SIDRQuery sends a SIDR_REQ (ib_send_cm_sidr_req), retransmitted until a
// SIDR_REP arrives; h gets the outcome once. Destroying the returned ID
// abandons the query (ib_destroy_cm_id): no retransmission and no call
// of h follows.
func (m *Manager) SIDRQuery(p SIDRParams, h SIDRHandler) (*ID, error) {
	if p.PKey == 0 {
		p.PKey = 0xFFFF
	}
	if p.Timeout <= 0 {
		p.Timeout = 4096 * time.Millisecond
	}
	if p.MaxCMRetries == 0 {
		p.MaxCMRetries = 15
	}
	pd, err := clonePD(p.PrivateData, mad.SIDRREQPrivateLen)
	if err != nil {
		return nil, err
	}
	if h == nil || !p.Src.IsValid() || !p.Dst.IsValid() {
		return nil, ErrInvalid
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	id := m.newID(nil)
	id.service = p.ServiceID
	id.local, id.remote = p.Src, p.Dst
	id.sidrHandler = h
	id.traffic = Traffic{TrafficClass: p.TrafficClass, HopLimit: p.HopLimit}
	if id.traffic.HopLimit == 0 {
		id.traffic.HopLimit = RouteHopLimit
	}
	id.tid = m.formTID(id)
	req := &mad.SIDRREQ{RequestID: id.localID, PKey: p.PKey, ServiceID: p.ServiceID, PrivateData: pd}
	b := m.marshal(id.tid, req)
	if b == nil {
		delete(m.ids, id.localID)
		m.mu.Unlock()
		return nil, ErrInvalid
	}
	m.setState(id, StateSIDRREQSent)
	m.armRetransmit(id, b, p.Timeout, int(p.MaxCMRetries), mad.AttrSIDRREQ)
	m.mu.Unlock()
	m.drain()
	return id, nil
}

// onSIDRREP is cm_sidr_rep_handler.
func (m *Manager) onSIDRREP(r rx, rep *mad.SIDRREP) {
	id := m.acquire(rep.RequestID, 0)
	if id == nil || id.state != StateSIDRREQSent {
		m.count(cntUnknownComm)
		return
	}
	m.free(id)
	h := id.sidrHandler
	res := SIDRResult{Status: rep.Status, QPN: rep.QPN, QKey: rep.QKey, ServiceID: rep.ServiceID,
		ClassPortInfo: rep.ClassPortInfo, PrivateData: rep.PrivateData}
	m.outbox = append(m.outbox, action{sidr: func() { h(res) }})
}

// sidrAnswerWindow is how long a SIDR_REP is kept to answer duplicates
// of its SIDR_REQ: about rdma_cm's whole SIDR schedule (15 retries of
// 4 s, cma_resolve_ib_udp).
const sidrAnswerWindow = time.Minute

// maxSIDRAnswers bounds the SIDR_REPs kept. Anyone can send SIDR_REQs,
// with any request ID and source address: without a bound a flood of
// them to a UD service would grow the table by one answer per request
// for a minute. Past the bound the oldest answer is forgotten: a late
// duplicate of its request then reaches the listener as a new one, as
// every duplicate does with cm.c.
const maxSIDRAnswers = 4096

// sidrAnswer is a SIDR_REP sent, kept for the duplicates of its request.
// It goes back to the key's peer, from src.
type sidrAnswer struct {
	mad   []byte
	src   netip.Addr
	until time.Time
	seq   uint64 // its sidrKept's
}

// sidrKept is an entry of Manager.sidrOrder: the answer kept under key
// with number seq, unless sidrSent holds another one there by now.
type sidrKept struct {
	key sidrKey
	seq uint64
}

// onSIDRREQ is cm_sidr_req_handler: a duplicate of a pending request is
// dropped; no listener answers SIDR_REP "unsupported".
//
// Unlike cm.c, which forgets a SIDR_REQ once it has answered it, a
// duplicate of an answered request (the network's copy, or the
// requester's retry after our SIDR_REP was lost) gets that SIDR_REP again
// rather than reaching the listener as a new request: a new request
// makes the application set up a second QP for the same requester, and
// the requester may take either answer: the likely cause of a udaddy
// run with duplication and reordering whose server waited for datagrams
// on a QP the client never used.
func (m *Manager) onSIDRREQ(r rx, req *mad.SIDRREQ) {
	k := sidrKey{r.src, req.RequestID}
	if m.sidrRcvd[k] != nil {
		m.count("rx_dup_sidr_req")
		return
	}
	if a, ok := m.sidrSent[k]; ok {
		if m.clock.Now().Before(a.until) {
			m.count("rx_dup_sidr_req")
			m.sendMAD(k.peer, a.src, r.replyTraffic(), slices.Clone(a.mad))
			return
		}
		delete(m.sidrSent, k)
	}
	l := m.findListener(req.ServiceID)
	if l == nil {
		m.count(cntRejNoListen)
		rep := &mad.SIDRREP{RequestID: req.RequestID, Status: mad.SIDRUnsupported, ServiceID: req.ServiceID}
		if b := m.marshal(r.hdr.TID, rep); b != nil {
			m.sendMAD(r.src, r.dst, r.replyTraffic(), b)
		}
		return
	}
	if m.halfOpen >= m.cfg.MaxHalfOpen {
		m.count(cntRejNoRes)
		return
	}
	// A SIDR ID receives no MADs: it is kept by the requester's
	// address and request ID only, not among the comm IDs.
	// Its SIDR_REP goes out on the AV cm_init_av_for_response built
	// from the SIDR_REQ (cm_sidr_req_handler): an answer's traffic.
	id := &ID{m: m, handler: l.handler, passive: true, remoteID: req.RequestID,
		service: req.ServiceID, tid: r.hdr.TID, local: r.dst, remote: r.src, sidrKey: k,
		traffic: r.replyTraffic()}
	m.sidrRcvd[k] = id
	m.setState(id, StateSIDRREQRcvd)
	m.emit(id, Event{Type: EventSIDRREQ, SIDRREQ: req, PrivateData: req.PrivateData})
}

// SIDRReplyParams is a SIDR_REP (ib_cm_sidr_rep_param).
type SIDRReplyParams struct {
	Status      mad.SIDRStatus
	QPN         uint32
	QKey        uint32
	Info        []byte // at most mad.SIDRREPInfoLen (ClassPortInfo on redirect)
	PrivateData []byte // at most mad.SIDRREPPrivateLen
}

// SIDRReply answers a SIDR_REQ (ib_send_cm_sidr_rep); the ID is gone after.
func (id *ID) SIDRReply(p SIDRReplyParams) error {
	pd, err := clonePD(p.PrivateData, mad.SIDRREPPrivateLen)
	if err != nil {
		return err
	}
	info, err := clonePD(p.Info, mad.SIDRREPInfoLen)
	if err != nil {
		return err
	}
	if p.QPN > mad.MaxQPN {
		return ErrInvalid
	}
	return id.do(func() error {
		if id.state != StateSIDRREQRcvd {
			return ErrState
		}
		b := id.m.sendSIDRREP(id, &mad.SIDRREP{Status: p.Status, QPN: p.QPN, QKey: p.QKey, ClassPortInfo: info, PrivateData: pd})
		id.m.keepSIDRAnswer(id, b)
		id.m.free(id)
		return nil
	})
}

func (m *Manager) sendSIDRREP(id *ID, rep *mad.SIDRREP) []byte {
	rep.RequestID = id.remoteID
	rep.ServiceID = id.service
	b := m.marshal(id.tid, rep)
	if b != nil {
		m.sendMAD(id.remote, id.local, id.traffic, b)
	}
	return b
}

// keepSIDRAnswer keeps the SIDR_REP b answering id's request for
// sidrAnswerWindow, dropping the answers whose window has passed.
func (m *Manager) keepSIDRAnswer(id *ID, b []byte) {
	if b == nil {
		return
	}
	now := m.clock.Now()
	// Every answer is kept equally long, so the order of sidrOrder is
	// the order of expiry: drop the expired ones and, past the bound,
	// the oldest, from the front.
	for len(m.sidrOrder) > 0 {
		o := m.sidrOrder[0]
		a, ok := m.sidrSent[o.key]
		if ok && a.seq == o.seq {
			if now.Before(a.until) && len(m.sidrSent) < maxSIDRAnswers {
				break
			}
			delete(m.sidrSent, o.key)
		}
		m.sidrOrder[0] = sidrKept{}
		m.sidrOrder = m.sidrOrder[1:]
	}
	m.sidrSeq++
	m.sidrSent[id.sidrKey] = sidrAnswer{mad: b, src: id.local, until: now.Add(sidrAnswerWindow), seq: m.sidrSeq}
	m.sidrOrder = append(m.sidrOrder, sidrKept{key: id.sidrKey, seq: m.sidrSeq})
}
