package cm

import (
	"net/netip"
	"time"

	"github.com/rxed/rxed/pkg/wire/mad"
)

const reasonTimeout = mad.REJTimeout

// ID is one connection (cm.c's cm_id) or one SIDR exchange. All its fields
// are guarded by the Manager's mu; its methods lock it.
type ID struct {
	m *Manager

	// Guarded by m.mu.
	state      State
	passive    bool
	freed      bool // out of every table; methods fail with ErrState
	handler    Handler
	localID    uint32 // our comm ID (request ID for SIDR)
	remoteID   uint32 // the peer's; 0 until known
	tid        uint64 // TID of our REP/RTU/MRA/REJ/DREP: the REQ's, or the last DREQ's
	service    uint64
	local      netip.Addr // our GID
	remote     netip.Addr // the peer's GID
	remoteGUID uint64
	localQPN   uint32
	remoteQPN  uint32
	// traffic is the traffic class and hop limit of the ID's primary AV,
	// which its own MADs leave with (see Traffic).
	traffic Traffic

	// cm_id_priv->timeout_ms and max_cm_retries: for our REQ (active),
	// REP (passive) and DREQ.
	timeout    time.Duration
	maxRetries int
	// avTimeout is cm.c's av.timeout (IBA time value): the path's
	// packet life time + 1, refined on the REP; timewait lasts
	// CMTimeout(avTimeout), and it is added to an MRA's service timeout.
	avTimeout uint8

	autoRTU        bool
	serviceTimeout uint8  // of our (delayed) MRA
	privateData    []byte // of our last MRA, RTU or DREP, resent with it
	inRemoteID     bool   // in m.remoteIDs under (remoteGUID, remoteID)
	inRemoteQP     bool   // in m.remoteQPs under (remoteGUID, remoteQPN)
	// dreqCrossed: the peer's DREQ came while ours was unanswered
	// (DREQ_SENT); we answered it and entered timewait, still owed the
	// DREP to ours (onDREP: EventCrossedDREP).
	dreqCrossed bool

	out         *retransmit
	gen         uint64 // bumped whenever out changes; stale timer callbacks see it
	timewait    Timer
	sidrHandler SIDRHandler
	sidrKey     sidrKey
}

// LocalCommID returns our comm ID.
func (id *ID) LocalCommID() uint32 { id.m.mu.Lock(); defer id.m.mu.Unlock(); return id.localID }

// RemoteCommID returns the peer's comm ID (0 until known).
func (id *ID) RemoteCommID() uint32 { id.m.mu.Lock(); defer id.m.mu.Unlock(); return id.remoteID }

// State returns the ID's state (IDLE once it is gone).
func (id *ID) State() State { id.m.mu.Lock(); defer id.m.mu.Unlock(); return id.state }

// Passive reports whether the ID was created by a received REQ or SIDR_REQ.
func (id *ID) Passive() bool { return id.passive }

// ServiceID returns the connection's service ID.
func (id *ID) ServiceID() uint64 { id.m.mu.Lock(); defer id.m.mu.Unlock(); return id.service }

// LocalAddr returns our GID; RemoteAddr the peer's.
func (id *ID) LocalAddr() netip.Addr { id.m.mu.Lock(); defer id.m.mu.Unlock(); return id.local }

// RemoteAddr returns the peer's GID.
func (id *ID) RemoteAddr() netip.Addr { id.m.mu.Lock(); defer id.m.mu.Unlock(); return id.remote }

// RemoteQPN returns the peer's QPN (from the REQ or the REP).
func (id *ID) RemoteQPN() uint32 { id.m.mu.Lock(); defer id.m.mu.Unlock(); return id.remoteQPN }

// RemoteCAGUID returns the peer's CA GUID (from the REQ or the REP).
func (id *ID) RemoteCAGUID() uint64 { id.m.mu.Lock(); defer id.m.mu.Unlock(); return id.remoteGUID }

// SetHandler replaces the ID's handler: a passive ID starts with its
// listener's. Events not yet delivered go to the new one.
func (id *ID) SetHandler(h Handler) { id.m.mu.Lock(); id.handler = h; id.m.mu.Unlock() }

// do runs step under the lock if the ID is alive, then drains the outbox.
func (id *ID) do(step func() error) error {
	m := id.m
	m.mu.Lock()
	var err error
	switch {
	case m.closed:
		err = ErrClosed
	case id.freed:
		err = ErrState
	default:
		err = step()
	}
	m.mu.Unlock()
	m.drain()
	return err
}

// newID allocates a local comm ID (random, non-zero, unused: cm.c draws
// them cyclically xor a random operand, so they look random on the wire).
func (m *Manager) newID(h Handler) *ID {
	id := &ID{m: m, handler: h}
	for {
		c := m.rnd.Uint32()
		if c != 0 && m.ids[c] == nil {
			id.localID = c
			break
		}
	}
	m.ids[id.localID] = id
	return id
}

// formTID is cm_form_tid: our hi TID over our comm ID.
func (m *Manager) formTID(id *ID) uint64 { return uint64(m.hiTID)<<32 | uint64(id.localID) }

// setState moves id to s, keeping the half-open count.
func (m *Manager) setState(id *ID, s State) {
	if id.passive && id.state.halfOpen() {
		m.halfOpen--
	}
	id.state = s
	if id.passive && s.halfOpen() {
		m.halfOpen++
	}
}

func (m *Manager) insertRemoteID(id *ID) bool {
	k := remoteKey{id.remoteGUID, id.remoteID}
	if m.remoteIDs[k] != nil {
		return false
	}
	m.remoteIDs[k] = id
	id.inRemoteID = true
	return true
}

// insertRemoteQP records (peer GUID, peer QPN); it returns the ID already
// holding it, if any.
func (m *Manager) insertRemoteQP(id *ID) *ID {
	k := remoteQPKey{id.remoteGUID, id.remoteQPN}
	if cur := m.remoteQPs[k]; cur != nil {
		return cur
	}
	m.remoteQPs[k] = id
	id.inRemoteQP = true
	return nil
}

func (m *Manager) removeRemote(id *ID) {
	if id.inRemoteID {
		k := remoteKey{id.remoteGUID, id.remoteID}
		if m.remoteIDs[k] == id {
			delete(m.remoteIDs, k)
		}
		id.inRemoteID = false
	}
	if id.inRemoteQP {
		k := remoteQPKey{id.remoteGUID, id.remoteQPN}
		if m.remoteQPs[k] == id {
			delete(m.remoteQPs, k)
		}
		id.inRemoteQP = false
	}
}

func (id *ID) stopTimers() {
	if id.out != nil && id.out.timer != nil {
		id.out.timer.Stop()
	}
	id.out = nil
	if id.timewait != nil {
		id.timewait.Stop()
		id.timewait = nil
	}
	id.gen++
}

// free is cm_reset_to_idle plus the destruction cm.c leaves to the
// consumer: the ID goes IDLE and leaves every table. Events already queued
// for it are still delivered.
func (m *Manager) free(id *ID) {
	if id.freed {
		return
	}
	id.stopTimers()
	m.removeRemote(id)
	m.setState(id, StateIdle)
	if m.ids[id.localID] == id {
		delete(m.ids, id.localID)
	}
	if m.sidrRcvd[id.sidrKey] == id {
		delete(m.sidrRcvd, id.sidrKey)
	}
	id.freed = true
}

// enterTimewait is cm_enter_timewait. Unlike cm.c, which drops the
// (GUID, comm ID) and (GUID, QPN) entries when timewait starts, the ID
// keeps them until timewait ends, so a REQ reusing the peer's QPN or comm
// ID during timewait is refused with REJ 10 (stale connection), as IBA
// 12.9.8.3 intends timewait to protect.
func (m *Manager) enterTimewait(id *ID) {
	m.cancelRetransmit(id)
	m.setState(id, StateTimewait)
	gen := id.gen
	id.timewait = m.clock.AfterFunc(CMTimeout(id.avTimeout), func() { m.onTimewaitExit(id, gen) })
}

func (m *Manager) onTimewaitExit(id *ID, gen uint64) {
	m.mu.Lock()
	if m.closed || id.freed || id.gen != gen || id.state != StateTimewait {
		m.mu.Unlock()
		return
	}
	id.timewait = nil
	m.count(cntTimewaitExit)
	m.free(id)
	m.emit(id, Event{Type: EventTimewaitExit})
	m.mu.Unlock()
	m.drain()
}

// clonePD copies private data the caller passed, checking its size.
func clonePD(p []byte, limit int) ([]byte, error) {
	if len(p) > limit {
		return nil, ErrInvalid
	}
	if len(p) == 0 {
		return nil, nil
	}
	return append([]byte(nil), p...), nil
}
