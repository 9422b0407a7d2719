package cm

import (
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"github.com/rxed/rxed/pkg/wire/mad"
)

// Config configures a Manager.
type Config struct {
	// NodeGUID is the local CA GUID put in REQ and REP. Peers key
	// duplicate and stale-connection detection on it, so it must be
	// stable for the device's lifetime (the caller derives it, e.g. from
	// the first GID's MAC-like bytes or a seed).
	NodeGUID uint64
	// Send transmits a whole MAD to QP 1 at dst from our GID src, with
	// the IP TOS and TTL of t (the address handle's, see Traffic). It is
	// called with no Manager lock held. An error counts as a lost MAD
	// (tx_errors); retransmission recovers as from loss on the wire.
	Send func(dst, src netip.Addr, t Traffic, mad []byte) error
	// Clock drives every timer; nil means SystemClock.
	Clock Clock
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Rand draws local comm IDs, the hi TID (when HiTID is 0) and
	// NewPSN's values. Used under the Manager's lock only. nil: seeded
	// from the runtime's random source.
	Rand *rand.Rand
	// MaxHalfOpen caps passive connections that have received a REQ (or
	// SIDR_REQ) and not yet an RTU: REQ_RCVD, MRA_REQ_SENT, REP_SENT,
	// MRA_REP_RCVD, SIDR_REQ_RCVD. A REQ beyond it is rejected with
	// REJ 3 (no resources) and counted (rej_no_resources). 0 means 1024.
	MaxHalfOpen int
	// HiTID is the upper half of the TIDs of requests we originate (the
	// MAD agent's hi_tid in the kernel); 0 draws one from Rand.
	HiTID uint32
	// CAAckDelay is the local CA ACK delay (IBA time value) the REQ's
	// local ACK timeout and the REP's target ACK delay are computed from,
	// as cm.c uses the device's. 0 means 15, rdma_rxe's.
	CAAckDelay uint8
	// MRAServiceTimeout is the service timeout of the MRA the Manager
	// arms on every received REQ and REP, as rdma_cm does (delayed: sent
	// only when the peer retransmits before we answer). 0 means 24
	// (about 68.7 s), rdma_cm's CMA_CM_MRA_SETTING.
	MRAServiceTimeout uint8
	// MaxDREQInterval caps the wait between DREQ retransmissions; 0 keeps
	// cm.c's (the REQ's or REP's timeout: 4-6 s with rdma_cm's values). A
	// shorter wait lets a DREQ whose DREP was lost be answered while the
	// peer is still in timewait (a peer in user space is gone after it);
	// a kernel peer answers duplicates with another DREP.
	MaxDREQInterval time.Duration
}

// Manager is one device's CM: every MAD received on QP 1 goes to
// HandleMAD, every MAD it sends leaves through Config.Send.
//
// Locking and goroutines: one mutex (mu) guards all state: the IDs, the
// lookup tables, the counters and the outbox. State steps run under it and
// never call out; what they decide to do outside (send a MAD, deliver an
// event) is appended to the outbox. The goroutine that made the step
// (HandleMAD's caller, a timer callback, or a caller of an ID method) then
// drains the outbox with mu released, unless another goroutine is already
// draining, in which case that one takes the new work too. So handlers and
// Config.Send are called one at a time, in the order the steps happened,
// never with mu held, and never from inside another handler call: a
// handler may call any Manager or ID method (the resulting sends and
// events run after it returns). A handler must not block for long: while
// it runs, other goroutines' events wait behind it.
type Manager struct {
	cfg   Config
	clock Clock
	log   *slog.Logger

	mu sync.Mutex
	// Guarded by mu.
	closed    bool
	closeDone chan struct{} // closed when the first Close has returned
	rnd       *rand.Rand
	hiTID     uint32
	ids       map[uint32]*ID         // by local comm ID (connections and SIDR queries)
	remoteIDs map[remoteKey]*ID      // by (peer CA GUID, peer comm ID), cm.c's remote_id_table
	remoteQPs map[remoteQPKey]*ID    // by (peer CA GUID, peer QPN), cm.c's remote_qp_table
	sidrRcvd  map[sidrKey]*ID        // passive SIDR IDs awaiting SIDRReply
	sidrSent  map[sidrKey]sidrAnswer // SIDR_REPs sent lately, for duplicates (sidr.go)
	sidrOrder []sidrKept             // sidrSent's entries, oldest first (may name forgotten ones)
	sidrSeq   uint64                 // numbers the entries of sidrSent
	listeners []*Listener
	halfOpen  int
	spareREPs allowance // REP retransmissions past the REQs' own budgets (reflect.go)
	counters  map[string]uint64
	outbox    []action
	draining  bool
	// idle is signalled (on mu) when a drain ends: Close waits for the
	// one in progress.
	idle *sync.Cond
}

type remoteKey struct {
	guid   uint64
	commID uint32
}

type remoteQPKey struct {
	guid uint64
	qpn  uint32
}

type sidrKey struct {
	peer      netip.Addr
	requestID uint32
}

// action is one entry of the outbox: a MAD to send, an event to deliver,
// or a step to take once the actions queued before it have run.
type action struct {
	mad      []byte
	dst, src netip.Addr
	traffic  Traffic
	id       *ID   // event for id's current handler
	ev       Event //
	sidr     func()
	// step runs under mu, in its turn: what a consumer of cm.c does once
	// its handler has returned (rdma_cm's delayed MRA after the REQ
	// event). It queues sends and events like any step.
	step func()
}

// New returns a Manager.
func New(cfg Config) *Manager {
	m := &Manager{
		cfg:       cfg,
		clock:     cfg.Clock,
		log:       cfg.Logger,
		rnd:       cfg.Rand,
		hiTID:     cfg.HiTID,
		ids:       make(map[uint32]*ID),
		remoteIDs: make(map[remoteKey]*ID),
		remoteQPs: make(map[remoteQPKey]*ID),
		sidrRcvd:  make(map[sidrKey]*ID),
		sidrSent:  make(map[sidrKey]sidrAnswer),
		counters:  make(map[string]uint64),
	}
	m.idle = sync.NewCond(&m.mu)
	if m.clock == nil {
		m.clock = SystemClock{}
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	if m.rnd == nil {
		m.rnd = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if m.cfg.MaxHalfOpen <= 0 {
		m.cfg.MaxHalfOpen = 1024
	}
	if m.cfg.CAAckDelay == 0 {
		m.cfg.CAAckDelay = 15
	}
	if m.cfg.MRAServiceTimeout == 0 {
		m.cfg.MRAServiceTimeout = 24
	}
	for m.hiTID == 0 {
		m.hiTID = m.rnd.Uint32()
	}
	return m
}

// NodeGUID returns Config.NodeGUID.
func (m *Manager) NodeGUID() uint64 { return m.cfg.NodeGUID }

// NewPSN returns a random 24-bit starting PSN, as the kernel draws one per
// connection.
func (m *Manager) NewPSN() uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rnd.Uint32() & mad.MaxQPN
}

// Close stops every timer and forgets every connection, listener and
// query; no handler is called afterwards (except those already being
// delivered). HandleMAD and new calls are ignored or fail with ErrClosed.
// It sends nothing of its own, but what the steps before it queued (the
// DREQ of a Destroy that another goroutine's drain took over) still
// leaves: Close returns once every such MAD has been handed to
// Config.Send, so that the caller may then close what Send writes to.
// Dropping them lost a destroyed connection's DREQ for good
// (TestCloseSendsWhatItsStepsQueued). Close must not be called from a
// handler, whose drain it would wait for. A second Close returns when the
// first has.
func (m *Manager) Close() {
	m.mu.Lock()
	if m.closed {
		// Another Close runs or ran: return when it has, so that every
		// caller may count on its MADs having been handed to Send.
		done := m.closeDone
		m.mu.Unlock()
		<-done
		return
	}
	m.closed = true
	m.closeDone = make(chan struct{})
	defer close(m.closeDone)
	for _, id := range m.ids {
		id.stopTimers()
		id.freed = true
	}
	for _, id := range m.sidrRcvd {
		id.freed = true
	}
	clear(m.ids)
	clear(m.remoteIDs)
	clear(m.remoteQPs)
	clear(m.sidrRcvd)
	clear(m.sidrSent)
	m.sidrOrder = nil
	m.listeners = nil
	m.halfOpen = 0
	// The MADs stay, the events and steps go.
	sends := m.outbox[:0]
	for _, a := range m.outbox {
		if a.mad != nil {
			sends = append(sends, a)
		}
	}
	clear(m.outbox[len(sends):])
	m.outbox = sends
	m.mu.Unlock()
	m.drain()
	m.mu.Lock()
	for m.draining {
		m.idle.Wait()
	}
	m.mu.Unlock()
}

// Counters returns a snapshot of the Manager's counters: rx_<msg>,
// tx_<msg>, tx_retries_<msg> and rx_dup_<msg> per message type as cm.c's
// cm_rx_msgs / cm_tx_msgs / cm_tx_retries / cm_rx_duplicates groups, plus
// the drops and answers named in counters.go.
func (m *Manager) Counters() map[string]uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]uint64, len(m.counters))
	for k, v := range m.counters {
		out[k] = v
	}
	return out
}

func (m *Manager) count(name string) { m.counters[name]++ }

// HandleMAD processes one MAD received on QP 1 from the peer GID src to our
// GID dst. It never keeps mad. Bad MADs are dropped and counted. It is
// HandleMADTraffic for a MAD that arrived with IP traffic class 0.
func (m *Manager) HandleMAD(src, dst netip.Addr, b []byte) { m.HandleMADTraffic(src, dst, 0, b) }

// HandleMADTraffic is HandleMAD for a MAD that arrived with IP traffic
// class class (the IPv6 traffic class or the IPv4 TOS, as its GRH holds
// it: ib.MADTrafficHandler), which an answer built from it may take
// (Traffic).
func (m *Manager) HandleMADTraffic(src, dst netip.Addr, class uint8, b []byte) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.receive(src, dst, class, b)
	m.mu.Unlock()
	m.drain()
}

// rx is a received MAD's addressing and header.
type rx struct {
	src, dst netip.Addr
	// class is the IP traffic class the MAD arrived with (replyTraffic).
	class uint8
	hdr   mad.Header
	// words are the message's data bytes 0-3 and 4-7 (mad.CommIDWords):
	// what cm_issue_rej swaps into a REJ answering it, whatever the
	// message (a REQ's bytes 4-7 are reserved and its vendor ID).
	words [2]uint32
	// data is the message's data bytes, for the fields cm.c reads
	// whatever the parsed message says (a timeout REJ's ARI); valid
	// only during the step.
	data []byte
}

func (m *Manager) receive(src, dst netip.Addr, class uint8, b []byte) {
	h, msg, err := mad.Parse(b)
	if err != nil {
		switch {
		case errors.Is(err, mad.ErrBadClass), errors.Is(err, mad.ErrBadVersion), errors.Is(err, mad.ErrBadMethod):
			m.count(cntBadHeader)
		case errors.Is(err, mad.ErrUnknownAttr):
			m.count(cntUnknownAttr)
		default:
			m.count(cntMalformed)
		}
		m.log.Debug("cm: dropped MAD", "src", src, "err", err)
		return
	}
	m.count("rx_" + msgName(h.AttrID))
	r := rx{src: src, dst: dst, class: class, hdr: h, data: b[mad.HeaderLen:]}
	r.words[0], r.words[1], _ = mad.CommIDWords(b[mad.HeaderLen:])
	switch v := msg.(type) {
	case *mad.REQ:
		m.onREQ(r, v)
	case *mad.MRA:
		m.onMRA(r, v)
	case *mad.REJ:
		m.onREJ(r, v)
	case *mad.REP:
		m.onREP(r, v)
	case *mad.RTU:
		m.onRTU(r, v)
	case *mad.DREQ:
		m.onDREQ(r, v)
	case *mad.DREP:
		m.onDREP(r, v)
	case *mad.SIDRREQ:
		m.onSIDRREQ(r, v)
	case *mad.SIDRREP:
		m.onSIDRREP(r, v)
	default:
		m.count(cntUnknownAttr)
	}
}

// acquire finds the ID with local comm ID local whose remote comm ID is
// remote (0 while it is unknown), as cm.c's cm_acquire_id.
func (m *Manager) acquire(local, remote uint32) *ID {
	id := m.ids[local]
	if id == nil || id.remoteID != remote {
		return nil
	}
	return id
}

// sendMAD queues b for Config.Send and counts it.
func (m *Manager) sendMAD(dst, src netip.Addr, t Traffic, b []byte) {
	if len(b) >= mad.HeaderLen {
		h, _ := mad.ParseHeader(b)
		m.count("tx_" + msgName(h.AttrID))
	}
	m.outbox = append(m.outbox, action{mad: b, dst: dst, src: src, traffic: t})
}

// marshal encodes m with tid; our own messages always fit (parameters are
// validated before a step starts), so an error is a bug, logged.
func (m *Manager) marshal(tid uint64, msg mad.Message) []byte {
	b, err := mad.Marshal(tid, msg)
	if err != nil {
		m.log.Error("cm: cannot encode", "attr", msgName(msg.AttrID()), "err", err)
		return nil
	}
	return b
}

// emit queues ev for id's handler.
func (m *Manager) emit(id *ID, ev Event) {
	ev.ID = id
	m.outbox = append(m.outbox, action{id: id, ev: ev})
}

// after queues step to run under mu once everything queued before it,
// handlers included, has run.
func (m *Manager) after(step func()) {
	m.outbox = append(m.outbox, action{step: step})
}

// drain runs the outbox with mu released, unless another goroutine is
// already draining (see Manager).
func (m *Manager) drain() {
	m.mu.Lock()
	if m.draining {
		m.mu.Unlock()
		return
	}
	m.draining = true
	for len(m.outbox) > 0 {
		a := m.outbox[0]
		m.outbox[0] = action{}
		m.outbox = m.outbox[1:]
		if a.step != nil {
			if !m.closed {
				a.step()
			}
			continue
		}
		var h Handler
		if a.id != nil {
			h = a.id.handler
		}
		m.mu.Unlock()
		m.run(a, h)
		m.mu.Lock()
	}
	m.outbox = nil
	m.draining = false
	m.idle.Broadcast()
	m.mu.Unlock()
}

func (m *Manager) run(a action, h Handler) {
	// A panicking handler must not leave the Manager draining forever.
	defer func() {
		if p := recover(); p != nil {
			m.mu.Lock()
			m.draining = false
			m.idle.Broadcast()
			m.mu.Unlock()
			panic(p)
		}
	}()
	switch {
	case a.mad != nil:
		if m.cfg.Send == nil {
			return
		}
		if err := m.cfg.Send(a.dst, a.src, a.traffic, a.mad); err != nil {
			m.mu.Lock()
			m.count(cntTxErrors)
			m.mu.Unlock()
			m.log.Debug("cm: send failed", "dst", a.dst, "err", err)
		}
	case a.sidr != nil:
		a.sidr()
	case h != nil:
		h(a.ev)
	}
}
