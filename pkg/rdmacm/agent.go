package rdmacm

import (
	"encoding/binary"
	"errors"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/wire/mad"
)

// agent is one device's connection manager: the MAD agent on QP 1, the
// cm.Manager it feeds, and rdma_cm's listeners by service ID.
//
// Lifetime: an agent is created on a device's first use and lives until
// the device closes (ib.Device.OnClose), as the kernel's CM serves every
// device: a REQ for a port nobody listens on must still get its REJ.
//
// Locking: registryMu guards the registry; a.mu guards a.listeners and
// a.live. Lock order: registryMu, then a.mu; a Conn's mu is never taken
// under a.mu (close copies live out first). The cm.Manager has its own lock and calls
// our handlers with it released. registryMu is never held across
// ib.Device.OnClose, which may run the agent's close (it takes registryMu)
// at once.
type agent struct {
	dev *ib.Device
	log *slog.Logger
	// mad is set once OpenMADAgent returned; the Manager may send (from
	// the MAD agent's own receive goroutine) before that.
	mad atomic.Pointer[ib.MADAgent]
	cm  *cm.Manager
	// clock is the CM's (Config.Clock): when a queued request expires
	// (listen_expiry.go) is on the time the CM retransmits by.
	clock  cm.Clock
	linger time.Duration
	// closing is set when the device's close hook (close) starts: the
	// registry keeps the agent while it lingers, but acquire hands it out
	// no more.
	closing atomic.Bool
	// gone is closed once close has stopped the CM: no CM event or SIDR
	// answer comes after it.
	gone chan struct{}
	// srcMismatch counts the requests refused for a header source that is
	// not their GRH source (rej_src_mismatch).
	srcMismatch atomic.Uint64
	// reqEvicted and reqSourceFull count the requests a listener's
	// backlog refused to make room for another source, and those it
	// turned away for their source's cap (listen_backlog.go).
	reqEvicted, reqSourceFull atomic.Uint64
	// reqExpired counts the queued requests refused because their active
	// side had given up (listen_expiry.go).
	reqExpired atomic.Uint64

	mu        sync.Mutex
	listeners map[uint64]*serviceListeners // by service ID
	// live are the connections whose CM ID may still exchange MADs (from
	// the REQ until timewait ends or the handshake fails): what a
	// lingering close waits for.
	live map[*Conn]struct{}
}

// serviceListeners are the rdma_cm listeners of one port (one cm.Listener
// for the service ID; rdma_cm chooses among them by address).
type serviceListeners struct {
	cml  *cm.Listener
	byIP []*Listener
}

var (
	registryMu sync.Mutex
	registry   = map[*ib.Device]*agent{}
)

// Config configures a device's connection manager (Enable).
type Config struct {
	// Clock drives the CM's retransmission and timewait timers and the
	// expiry of queued requests; nil is the system clock
	// (cmtest.FakeClock in tests).
	Clock cm.Clock
	// Logger receives the CM's debug logs; nil is silent.
	Logger *slog.Logger
	// MaxHalfOpen caps passive connections between their REQ and their
	// RTU (REJ 3 beyond it, counted); 0 is the CM's default (1024).
	MaxHalfOpen int
	// Linger is how long closing the device waits for its connections to
	// settle (our DREQ answered; after answering the peer's DREQ, the end
	// of timewait), as the kernel's CM outlives the process that used it:
	// a peer whose DREP got lost is then still answered. 0 closes at once.
	Linger time.Duration
}

// dreqInterval caps the CM's DREQ retransmission wait (cm.Config
// MaxDREQInterval): below the peer's timewait (2 s with rdma_cm's
// values), so that a lingering peer still answers a retried DREQ.
const dreqInterval = time.Second

// mraServiceTimeout is the service timeout of our MRAs (cm.Config
// MRAServiceTimeout): 20, 4.3 s, not rdma_cm's 24 (68.7 s). An MRA goes out
// only when a REQ or REP duplicate arrives before the application has
// answered; a Go application answers in microseconds, so that is a
// network duplicate racing the answer, and the peer, told to wait 68.7 s
// before retrying, turned one lost RTU after it into a minute's stall
// (TestPerfRDMACM/write_bw_faults: 2% loss and 2% duplication, the server's
// Accept ran out of its 90 s). 4.3 s is the CM response timeout rdma_cm
// announces in its REQ.
const mraServiceTimeout = 20

// ErrEnabled: Enable with a configuration on a device whose connection
// manager already runs.
var ErrEnabled = errors.New("rdmacm: the device's connection manager is already running")

// Enable starts the connection manager on dev (QP 1 and the IB CM), so
// that the device answers CM requests (with a REJ when nobody listens)
// before any Listen or Dial, which otherwise start it with the defaults
// (cfg nil). It stops when the device closes. Enabling a running one with
// a nil cfg is a no-op; with a cfg it is ErrEnabled.
func Enable(dev *ib.Device, cfg *Config) error {
	if dev == nil {
		return errors.New("rdmacm: Enable: nil device")
	}
	if running(dev) != nil && cfg != nil {
		return ErrEnabled
	}
	_, err := acquireWith(dev, cfg)
	return err
}

// running returns dev's agent if one runs (nil otherwise), starting none.
func running(dev *ib.Device) *agent {
	registryMu.Lock()
	defer registryMu.Unlock()
	return registry[dev]
}

// acquire returns dev's agent, creating it with the defaults on first use.
func acquire(dev *ib.Device) (*agent, error) { return acquireWith(dev, nil) }

func acquireWith(dev *ib.Device, cfg *Config) (*agent, error) {
	a, fresh, err := register(dev, cfg)
	if err != nil || !fresh {
		return a, err
	}
	// Not under registryMu: on a device whose close hooks already run,
	// OnClose runs a.close at once, here, and a.close takes registryMu.
	// Holding it deadlocked this goroutine for good, and with it every
	// rdmacm call of the process (TestAcquireWhileTheDeviceCloses).
	dev.OnClose(a.close)
	if a.closing.Load() {
		return nil, ib.ErrDeviceClosed
	}
	return a, nil
}

// register returns dev's agent from the registry, or makes one, opens its
// MAD agent and enters it (fresh). A closing agent (its device's close
// hook has started) is not handed out: it would never hear a MAD again.
func register(dev *ib.Device, cfg *Config) (a *agent, fresh bool, err error) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if a := registry[dev]; a != nil {
		if a.closing.Load() {
			return nil, false, ib.ErrDeviceClosed
		}
		return a, false, nil
	}
	if cfg == nil {
		cfg = &Config{}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	clock := cfg.Clock
	if clock == nil {
		clock = cm.SystemClock{}
	}
	a = &agent{dev: dev, log: log, clock: clock, listeners: map[uint64]*serviceListeners{}, live: map[*Conn]struct{}{}, linger: cfg.Linger, gone: make(chan struct{})}
	// The Manager's Send goes to the MAD agent, which does not exist yet
	// when the Manager is made; nothing is sent before both exist.
	a.cm = cm.New(cm.Config{
		NodeGUID:    nodeGUID(dev),
		Send:        a.send,
		Clock:       cfg.Clock,
		Logger:      log,
		MaxHalfOpen: cfg.MaxHalfOpen,

		MaxDREQInterval:   dreqInterval,
		MRAServiceTimeout: mraServiceTimeout,
	})
	// The received traffic class too: the CM answers some MADs with it
	// (cm.Traffic); QP 1 has the device's transport report it.
	m, err := ib.OpenMADAgent(dev, ib.MADAgentConfig{TrafficHandler: a.cm.HandleMADTraffic, Logger: cfg.Logger})
	if err != nil {
		a.cm.Close()
		return nil, false, err
	}
	a.mad.Store(m)
	registry[dev] = a
	return a, true, nil
}

// cmErr gives the CM's "manager closed" (the device's close hook stopped
// it between an acquire and the call) rdmacm's ib.ErrDeviceClosed.
func cmErr(err error) error {
	if errors.Is(err, cm.ErrClosed) {
		return ib.ErrDeviceClosed
	}
	return err
}

// send is the Manager's Config.Send: the MAD leaves with t's IP TOS and
// TTL, its AH's (the connection's path or, for an answer, the received
// MAD's; see cm.Traffic).
func (a *agent) send(dst, src netip.Addr, t cm.Traffic, b []byte) error {
	m := a.mad.Load()
	if m == nil {
		// A REQ arrived while QP 1 was being opened and is answered
		// before the agent is complete: the MAD is lost, as on a full
		// queue, and the peer's retransmission finds us ready.
		return ib.ErrMADAgentClosed
	}
	return m.SendTraffic(src, dst, t.TrafficClass, t.HopLimit, b)
}

// close stops the agent when its device closes, first waiting up to the
// linger time for live connections to finish.
func (a *agent) close() {
	a.closing.Store(true)
	// Nobody will accept what the listeners left open still hold: it is
	// refused now, while the CM can still answer, as Listener.Close
	// refuses it (REJ 28, SIDR_REP REJECT; no req_expired), which also
	// stops the backlogs' expiry timers. Their callbacks outlived the
	// device, up to maxQueuedREQ on the system clock, then refused the
	// requests against the closed CM and counted them req_expired
	// (TestDeviceCloseDrainsListenerBacklogs).
	a.refuseQueued()
	a.mu.Lock()
	var live []*Conn
	for c := range a.live {
		live = append(live, c)
	}
	a.mu.Unlock()
	// Connections still up (or still connecting) end as a destroyed
	// cm_id does: one DREQ (or REJ) to the peer, nothing to wait for.
	var gone []chan struct{}
	for _, c := range live {
		c.mu.Lock()
		up, id := !c.ended, c.id
		c.mu.Unlock()
		if up && id != nil {
			id.Destroy()
			c.end(ErrDisconnected)
			c.settle()
			continue
		}
		gone = append(gone, c.settled)
	}
	if a.linger > 0 {
		deadline := time.NewTimer(a.linger)
		defer deadline.Stop()
	wait:
		for _, g := range gone {
			select {
			case <-g:
			case <-deadline.C:
				break wait
			}
		}
	}
	a.cm.Close()
	close(a.gone)
	// A request the CM's handler queued after the refusal above: its ID
	// is gone with the CM, and no handler runs any more.
	a.refuseQueued()
	_ = a.mad.Load().Close()
	// Out of the registry last: until QP 1 is free again, an acquire must
	// find this agent closing (ErrDeviceClosed), not try to open a second
	// MAD agent on the device (TestDialRacingDeviceCloseReturns).
	registryMu.Lock()
	delete(registry, a.dev)
	registryMu.Unlock()
}

// refuseQueued refuses every request queued in a listener's backlog, as
// Listener.Close does. The listeners are copied out first: a refusal
// takes a Conn's mu and untracks it (agent.mu).
func (a *agent) refuseQueued() {
	a.mu.Lock()
	var ls []*Listener
	for _, sl := range a.listeners {
		ls = append(ls, sl.byIP...)
	}
	a.mu.Unlock()
	for _, l := range ls {
		l.rejectQueued(rejectRequest)
	}
}

// track and untrack maintain the live set.
func (a *agent) track(c *Conn) {
	a.mu.Lock()
	a.live[c] = struct{}{}
	a.mu.Unlock()
}

func (a *agent) untrack(c *Conn) {
	a.mu.Lock()
	delete(a.live, c)
	a.mu.Unlock()
}

// nodeGUID derives the device's CA GUID from its GID table: stable for
// the device (and across restarts with the same addresses), as peers key
// duplicate and stale-connection detection on it. The top byte is 0x02
// (a locally administered EUI-64, like the U/L bit of a MAC-derived one)
// so it cannot collide with a NIC's.
func nodeGUID(dev *ib.Device) uint64 {
	h := fnv.New64a()
	for _, g := range dev.GIDs() {
		b := g.As16()
		h.Write(b[:])
	}
	var p [2]byte
	binary.BigEndian.PutUint16(p[:], dev.UDPPort())
	h.Write(p[:])
	return 0x02<<56 | h.Sum64()&(1<<56-1)
}

// localGID picks our GID for a connection to peer: want when valid (it
// must be in the table), else the first GID of peer's family.
func localGID(dev *ib.Device, want, peer netip.Addr) (netip.Addr, bool) {
	if want.IsValid() {
		want = want.Unmap()
		return want, dev.GIDIndex(want) >= 0
	}
	v4 := peer.Unmap().Is4()
	for _, g := range dev.GIDs() {
		if g.Unmap().Is4() == v4 {
			return g.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

// serviceID is rdma_cm's service ID for a port in a port space.
func serviceID(ps mad.PortSpace, port uint16) uint64 {
	if ps == 0 {
		ps = mad.PortSpaceTCP
	}
	return mad.ServiceID(ps, port)
}
