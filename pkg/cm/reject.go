package cm

import (
	"encoding/binary"

	"github.com/rxed/rxed/pkg/wire/mad"
)

// issueREJ is cm_issue_rej: a REJ answering a received message that has
// no ID (or must not get one), echoing its TID. Its comm IDs are the
// received message's first two data words, swapped, as cm.c copies them
// whatever the message: a REP's comm IDs, and for a REQ its local comm ID
// as remote and its bytes 4-7 (reserved, and the vendor ID) as local,
// zero from rdma_cm.
func (m *Manager) issueREJ(r rx, reason mad.REJReason, msgRejected uint8, ari []byte) {
	rej := &mad.REJ{LocalCommID: r.words[1], RemoteCommID: r.words[0], MessageRejected: msgRejected, Reason: reason, ARI: ari}
	if b := m.marshal(r.hdr.TID, rej); b != nil {
		m.sendMAD(r.src, r.dst, r.replyTraffic(), b)
	}
}

// formatREJ is cm_format_rej: a REJ from id as it stands in state s.
func (m *Manager) formatREJ(id *ID, s State, reason mad.REJReason, ari, pd []byte) []byte {
	rej := &mad.REJ{LocalCommID: id.localID, RemoteCommID: id.remoteID, Reason: reason, ARI: ari, PrivateData: pd}
	switch s {
	case StateREQRcvd:
		rej.LocalCommID = 0
		rej.MessageRejected = mad.REJMsgREQ
	case StateMRAREQSent:
		rej.MessageRejected = mad.REJMsgREQ
	case StateREPRcvd, StateMRAREPSent:
		rej.MessageRejected = mad.REJMsgREP
	default:
		rej.MessageRejected = mad.REJMsgOther
	}
	return m.marshal(id.tid, rej)
}

// Reject sends a REJ (ib_send_cm_rej): the passive side refusing a REQ, or
// the active side refusing a REP. ari is at most mad.REJARILen bytes,
// privateData at most mad.REJPrivateLen. rdma_cm rejects with
// mad.REJConsumerDefined. No event follows; a REJ after the REP was sent
// leaves the ID in TIMEWAIT (then EventTimewaitExit), otherwise it is gone.
func (id *ID) Reject(reason mad.REJReason, ari, privateData []byte) error {
	pd, err := clonePD(privateData, mad.REJPrivateLen)
	if err != nil {
		return err
	}
	a, err := clonePD(ari, mad.REJARILen)
	if err != nil {
		return err
	}
	return id.do(func() error { return id.m.sendREJ(id, reason, a, pd) })
}

// sendREJ is cm_send_rej_locked.
func (m *Manager) sendREJ(id *ID, reason mad.REJReason, ari, pd []byte) error {
	s := id.state
	switch s {
	case StateREQSent, StateMRAREQRcvd, StateREQRcvd, StateMRAREQSent, StateREPRcvd, StateMRAREPSent:
		b := m.formatREJ(id, s, reason, ari, pd)
		m.free(id)
		if b != nil {
			m.sendMAD(id.remote, id.local, id.traffic, b)
		}
	case StateREPSent, StateMRAREPRcvd:
		b := m.formatREJ(id, s, reason, ari, pd)
		m.enterTimewait(id)
		if b != nil {
			m.sendMAD(id.remote, id.local, id.traffic, b)
		}
	default:
		return ErrState
	}
	return nil
}

// onREJ is cm_rej_handler with cm_acquire_rejected_id.
func (m *Manager) onREJ(r rx, rej *mad.REJ) {
	var id *ID
	switch {
	case rej.Reason == mad.REJTimeout:
		// The ARI of a timeout REJ is the sender's CA GUID, and the REJ
		// may name only its own comm ID. cm_acquire_rejected_id reads
		// the GUID from the ARI area whatever the ARI length says, so a
		// REJ whose length is short or 0 finds the ID all the same.
		if ari := mad.REJARIArea(r.data); ari != nil {
			id = m.remoteIDs[remoteKey{binary.BigEndian.Uint64(ari), rej.LocalCommID}]
		}
	case rej.MessageRejected == mad.REJMsgREQ:
		id = m.acquire(rej.RemoteCommID, 0)
	default:
		id = m.acquire(rej.RemoteCommID, rej.LocalCommID)
	}
	if id == nil {
		m.count(cntUnknownComm)
		return
	}
	ev := Event{Type: EventREJ, Reason: rej.Reason, ARI: rej.ARI, PrivateData: rej.PrivateData}
	switch id.state {
	case StateREQSent, StateMRAREQRcvd, StateREPSent, StateMRAREPRcvd, StateREQRcvd, StateMRAREQSent:
		m.cancelRetransmit(id)
		if rej.Reason == mad.REJStaleConn {
			m.enterTimewait(id)
		} else {
			m.free(id)
		}
	case StateDREQSent, StateREPRcvd, StateMRAREPSent, StateEstablished:
		m.enterTimewait(id)
	default:
		m.count(cntWrongState)
		return
	}
	m.emit(id, ev)
}

// Destroy ends the ID at once (ib_destroy_cm_id), telling the peer what
// its state calls for: a REJ (timeout before the REP, consumer defined
// after), a DREQ (sent once) when established, a DREP to a received DREQ,
// SIDR_REP REJECT to a pending SIDR_REQ. No event follows, and the ID is
// not held in timewait. Destroying a gone ID is a no-op.
func (id *ID) Destroy() { id.destroy(false) }

// DestroyNoReject is cm_destroy_id with -ENOMEM, what cm.c does when a
// consumer's REQ handler fails for want of room (ucma's full backlog): an
// ID still in REQ_RCVD goes without a REJ (cm_reset_to_idle, "do not
// reject to allow future retries") and out of every table, so the peer's
// retransmitted REQ is a new request, not a duplicate or a stale
// connection, and may find room then; counted req_dropped. In every
// other state (the delayed MRA armed, an answer sent) it is Destroy.
func (id *ID) DestroyNoReject() { id.destroy(true) }

func (id *ID) destroy(noReject bool) {
	_ = id.do(func() error {
		m := id.m
		if noReject && id.state == StateREQRcvd {
			m.count(cntREQDropped)
			m.free(id)
			return nil
		}
		switch id.state {
		case StateREQSent, StateMRAREQRcvd:
			guid := binary.BigEndian.AppendUint64(nil, m.cfg.NodeGUID)
			_ = m.sendREJ(id, mad.REJTimeout, guid, nil)
		case StateREQRcvd, StateMRAREQSent, StateREPRcvd, StateMRAREPSent, StateREPSent, StateMRAREPRcvd:
			_ = m.sendREJ(id, mad.REJConsumerDefined, nil, nil)
		case StateEstablished:
			dreq := &mad.DREQ{LocalCommID: id.localID, RemoteCommID: id.remoteID, RemoteQPN: id.remoteQPN}
			if b := m.marshal(m.formTID(id), dreq); b != nil {
				m.sendMAD(id.remote, id.local, id.traffic, b)
			}
		case StateDREQRcvd:
			m.sendDREP(id, nil)
		case StateSIDRREQRcvd:
			m.sendSIDRREP(id, &mad.SIDRREP{Status: mad.SIDRReject})
		}
		m.free(id)
		return nil
	})
}
