// Package ib is rxed's verbs API: the concepts, names and error behaviour
// of libibverbs over a pure-Go RoCEv2 engine that interoperates with
// Linux rdma_rxe.
//
// A program opens a Device on one or more local IP addresses (they form
// the GID table), allocates a protection domain, registers memory, creates
// completion queues and queue pairs, moves the QPs to RTS with the peer's
// address, QPN and PSN (exchanged out of band, as with ibv_rc_pingpong),
// and posts work requests:
//
//	dev, _ := ib.OpenDevice(ib.Config{Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
//	pd, _ := dev.AllocPD()
//	mr, _ := pd.RegMR(buf, ib.AccessLocalWrite|ib.AccessRemoteWrite)
//	cq, _ := dev.CreateCQ(256)
//	qp, _ := pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, Cap: ib.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}})
//	// ... qp.Modify to INIT, RTR, RTS ...
//	qp.PostSend(ib.SendWR{Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled, SGL: []ib.SGE{{Addr: mr.IOVA(), Length: 4096, LKey: mr.LKey()}}, RemoteAddr: raddr, RKey: rkey})
//	n, _ := cq.WaitPoll(ctx, wcs) // wcs[:n] holds the completions
//
// Value types (SendWR, WC, QPAttr, ...) are aliases of pkg/qp and pkg/mr
// types, with libibverbs' numeric values.
//
// A wait that its ctx ends (CQ.Wait, CQ.WaitPoll, HybridWaiter.Wait,
// CompChannel.GetCQEvent, MADAgent.SendContext) returns ctx's error, with
// the cause its canceller gave (context.Cause) when there is one:
// errors.Is finds context.Canceled or context.DeadlineExceeded, and the
// cause (qp.ContextError).
package ib

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce"
	"github.com/rxed/rxed/pkg/roce/transport"
)

// Config opens a Device.
type Config struct {
	// Addrs are the local IPv4/IPv6 addresses to bind; they make up the GID
	// table in this order (GID index 0 is the first), without their zones:
	// an IPv6 link-local address needs one to bind (fe80::1%eth0, the
	// interface the socket then sends on) and is GID fe80::1. Required unless Conn
	// is set, in which case they default to Conn's addresses (a Conn bound
	// to :: serves GIDs such as fe80::1 given here, sending on the
	// interface that has each).
	Addrs []netip.Addr
	// Port is the UDP port; 0 means 4791, the RoCEv2 port every rdma_rxe
	// peer uses. Ports other than 4791 only make sense between rxed engines
	// (tests, loopback demos); peers then set AddrVector.DestPort.
	Port uint16
	// EphemeralPort binds a free port chosen by the kernel instead of Port.
	EphemeralPort bool
	// Conn, if set, is the transport to use instead of opening UDP sockets
	// (for example a transport.MemNetwork conn). The device owns it.
	Conn transport.Conn
	// Fault, if set, injects loss, duplication, reordering, corruption and
	// delay into what the device sends and receives (transport.NewFaulty;
	// transport.ParseFaultSpec reads rxed's --fault syntax).
	Fault *transport.FaultConfig
	// Wrap, if set, wraps the transport (after Fault and Pcap) before the
	// engine uses it: the daemon's accounting, which drops what a
	// session's budget does not allow.
	Wrap func(transport.Conn) (transport.Conn, error)
	// Pcap, if set, records every packet the device sends and receives,
	// between Fault and Wrap: the capture shows what the engine sent
	// before fault injection lost or damaged it, and what reached the
	// device after, as the engine sees it; a datagram Wrap drops is
	// recorded when it arrived (it did) and not when it was to be sent
	// (it never left).
	Pcap io.Writer
	// Logger receives debug and error logs; nil is silent.
	Logger *slog.Logger
	// Clock drives the protocol timers; nil is the system clock.
	Clock roce.Clock
	// IBATimerOnly leaves retransmission to IBA's local ACK timeout alone,
	// as rdma_rxe does: the requester's faster timer of its own, which
	// resends after a few round trips without an answer and spends no
	// retry_cnt (pkg/qp's recovery.go), is off. For tests that count
	// every packet, and comparisons with rxe.
	IBATimerOnly bool
	// Workers is the number of engine worker goroutines; 0 picks one per
	// CPU (at most 8).
	Workers int
	// ActiveMTU is the port's active MTU; 0 means MTU4096 (rxe on a
	// loopback or jumbo-frame link).
	ActiveMTU MTU
	// BusyPoll, when positive, keeps the engine's receive goroutine
	// polling the socket after each batch until the device has been
	// silent that long (roce.Config.BusyPoll, like SO_BUSY_POLL): a CPU
	// spent while traffic flows, for no thread wake-up at each of its
	// gaps. For an application that idles while the device serves
	// one-sided operations; one that waits for completions spins itself
	// (HybridWaiter). 0: off.
	BusyPoll time.Duration
	// DoorbellBatch, when positive, lets the posts of several goroutines
	// leave in one send while at least four goroutines spin on the
	// device's completions (HybridWaiter): a post waits up to this long
	// for others to join it (roce.Config.DoorbellBatch). For a device
	// many connections post and wait on at once (a key-value client of
	// many connections: twice the GETs per second at 16); a post then
	// leaves up to this much later. 0: every post is sent at once.
	DoorbellBatch time.Duration
}

// Device is an opened RoCE device (struct ibv_context).
//
// Goroutine safety: every method may be called from any goroutine and
// concurrently, Close included (see Close for what it wakes). The same
// holds for every object of the package (PD, CQ, QP, SRQ, AH, MR, MW,
// CompChannel): verbs on one object may run concurrently with each other
// and with the engine; each type's doc says what that means for it.
type Device struct {
	eng   *roce.Engine
	gids  []netip.Addr
	port  uint16
	mtu   MTU
	async *asyncQueue   // Events (asyncqueue.go); its pump is joined by Close
	down  atomic.Bool   // Close was called (lock-free check for the post path)
	done  chan struct{} // closed when Close has stopped the engine
	hooks closeHooks    // OnClose

	closeOnce sync.Once
	closeErr  error

	mu  sync.Mutex       // guards cqs
	cqs map[*CQ]struct{} // live CQs, woken by Close
}

// OpenDevice opens a device as configured.
func OpenDevice(cfg Config) (*Device, error) {
	conn := cfg.Conn
	var err error
	if conn == nil {
		if len(cfg.Addrs) == 0 {
			return nil, errors.New("ib: OpenDevice: no local address")
		}
		port := int(cfg.Port)
		if port == 0 && !cfg.EphemeralPort {
			port = transport.RoCEv2Port
		}
		if cfg.EphemeralPort {
			port = 0
		}
		conn, err = transport.OpenUDP(transport.UDPConfig{Addrs: cfg.Addrs, Port: port, Logger: cfg.Logger})
		if err != nil {
			return nil, wrap("OpenDevice", err)
		}
	}
	if cfg.Fault != nil {
		if err := cfg.Fault.Validate(); err != nil {
			conn.Close()
			return nil, wrap("OpenDevice", err)
		}
		conn = transport.NewFaulty(conn, *cfg.Fault)
	}
	if cfg.Pcap != nil {
		rec, err := transport.NewPcapRecorder(conn, cfg.Pcap, transport.PcapOptions{Logger: cfg.Logger})
		if err != nil {
			conn.Close()
			return nil, wrap("OpenDevice", err)
		}
		conn = rec
	}
	if cfg.Wrap != nil {
		w, err := cfg.Wrap(conn)
		if err != nil {
			conn.Close()
			return nil, wrap("OpenDevice", err)
		}
		conn = w
	}
	d := &Device{mtu: cfg.ActiveMTU, done: make(chan struct{})}
	if d.mtu == 0 {
		d.mtu = MTU4096
	}
	gids := cfg.Addrs
	if len(gids) == 0 {
		for _, ap := range conn.LocalAddrs() {
			gids = append(gids, ap.Addr())
		}
	}
	for _, g := range gids {
		// A GID has no zone: fe80::1%eth0 binds the socket to eth0 and is
		// GID fe80::1, as in rdma_rxe's table.
		d.gids = append(d.gids, transport.GIDAddr(g))
	}
	if las := conn.LocalAddrs(); len(las) > 0 {
		d.port = las[0].Port()
	}
	d.eng, err = roce.New(roce.Config{Conn: conn, GIDs: d.gids, Workers: cfg.Workers, Clock: cfg.Clock, IBATimerOnly: cfg.IBATimerOnly,
		Logger: cfg.Logger, Mem: mr.NewTable(nil), BusyPoll: cfg.BusyPoll,
		DoorbellBatch: cfg.DoorbellBatch})
	if err != nil {
		conn.Close()
		return nil, wrap("OpenDevice", err)
	}
	// The QPs' events come through their own hooks (QP.raiseOn), which
	// know the QP a destroy drops them with: the engine's OnEvent, which
	// names it by a number the next QP may get, is not used.
	d.async = newAsyncQueue()
	d.post(AsyncEvent{Type: EventPortActive, Port: 1}, nil)
	return d, nil
}

// Close stops the engine and releases the transport (ibv_close_device).
// The OnClose hooks run first, while the device still works. Then every
// waiter wakes: CQ.Wait, CQ.WaitPoll and CompChannel.GetCQEvent return
// ErrDeviceClosed, CQ.PollCQ returns it once the CQ is empty, and the
// channels of CQ.Notify and Done are closed; the asynchronous events not
// yet read are dropped (Events). Afterwards every verb that
// creates, posts, modifies or queries (QP.Query, SRQ.Query) fails with
// ErrDeviceClosed, while
// destroying what is left (QP.Destroy, SRQ.Destroy, CQ.Destroy,
// MR.Dereg, PD.Dealloc) succeeds, so a program can tear down in any
// order. Close may be called more than once and from several
// goroutines; each call returns when the device is closed.
func (d *Device) Close() error {
	d.closeOnce.Do(func() {
		// The hooks run first, while the device still works: a service
		// on top of it may need verbs to tear itself down.
		d.runCloseHooks()
		d.down.Store(true)
		d.closeErr = d.eng.Close()
		// After the engine: no worker raises an event any more.
		d.async.close()
		close(d.done)
		d.mu.Lock()
		cqs := d.cqs
		d.cqs = nil
		d.mu.Unlock()
		for cq := range cqs {
			cq.wake()
		}
	})
	return d.closeErr
}

// Done returns a channel closed once Close has stopped the device: a
// goroutine reading Events (which stays open and yields nothing after
// Close) selects on it too.
func (d *Device) Done() <-chan struct{} { return d.done }

// Name returns the device name, "rxed0".
func (d *Device) Name() string { return "rxed0" }

// Engine returns the underlying engine, for advanced use (its memory
// table, per-address ports); the verbs, Counters and Progress cover what
// a program needs.
func (d *Device) Engine() *roce.Engine { return d.eng }

// Progress receives and handles, in the calling goroutine, what the
// device's socket has queued, and returns how many packets it handled.
// CQ.Poll and CQ.WaitPoll call it when their CQ is empty; a program that
// spins on something else (a memory flag a peer's RDMA WRITE sets, say)
// calls it to make progress without waiting for the engine's receive
// goroutine. It returns 0 at once when another goroutine is receiving,
// when the transport cannot be polled (in-memory and multi-socket
// transports) and after Close. It must not be called from a qp-level
// completion hook; any other goroutine may call it at any time.
//
// A call says "I spin": while the calls keep coming (and find nothing),
// a datagram's arrival wakes no thread, the next call takes it (Linux).
// A spinner that stops calling delays the device's next datagram by at
// most 200 us; one that goes to sleep says so with StopPolling.
func (d *Device) Progress() int {
	if d.down.Load() {
		return 0
	}
	return d.eng.Progress()
}

// StopPolling says that the goroutine that spun on Progress (or on
// CQ.Poll) stops: the engine's receive goroutine waits on the socket
// again at once instead of when the spinner's last call lapses.
// CQ.WaitPoll does it before it sleeps.
func (d *Device) StopPolling() {
	if !d.down.Load() {
		d.eng.StopPolling()
	}
}

// UDPPort returns the UDP port the device receives on.
func (d *Device) UDPPort() uint16 { return d.port }

// GIDs returns the GID table as RoCEv2 GIDs: IPv4 addresses in their
// IPv4-mapped IPv6 form (::ffff:a.b.c.d), IPv6 addresses as they are.
func (d *Device) GIDs() []netip.Addr {
	out := make([]netip.Addr, len(d.gids))
	for i, g := range d.gids {
		out[i] = gidOf(g)
	}
	return out
}

func gidOf(a netip.Addr) netip.Addr {
	if a.Is4() {
		return netip.AddrFrom16(a.As16())
	}
	return a
}

// QueryGID returns GID index of port 1 (ibv_query_gid).
func (d *Device) QueryGID(port uint8, index int) (netip.Addr, error) {
	if port != 1 {
		return netip.Addr{}, fmt.Errorf("ib: QueryGID: no port %d", port)
	}
	if index < 0 || index >= len(d.gids) {
		return netip.Addr{}, fmt.Errorf("ib: QueryGID: index %d out of range (table has %d)", index, len(d.gids))
	}
	return gidOf(d.gids[index]), nil
}

// GIDIndex returns the index of addr in the GID table, or -1.
func (d *Device) GIDIndex(addr netip.Addr) int {
	for i, g := range d.gids {
		if g == addr.Unmap() {
			return i
		}
	}
	return -1
}

// Counters returns the device's counters by rdma_rxe's names, plus one
// per receive drop reason (drop_*).
func (d *Device) Counters() map[string]uint64 { return d.eng.Counters() }

// DeviceAttr is struct ibv_device_attr (the fields that matter here),
// filled with rdma_rxe's limits (rxe_param.h).
type DeviceAttr struct {
	FwVer              string // fw_ver: firmware version string
	NodeGUID           uint64 // node_guid: derived from the first GID (rxe uses the MAC)
	SysImageGUID       uint64 // sys_image_guid: same as NodeGUID
	MaxMRSize          uint64 // max_mr_size: largest region in bytes (RXE_MAX_MR_SIZE)
	PageSizeCap        uint64 // page_size_cap: supported page sizes (RXE_PAGE_SIZE_CAP)
	VendorID           uint32 // vendor_id (RXE_VENDOR_ID)
	VendorPartID       uint32 // vendor_part_id
	HwVer              uint32 // hw_ver
	MaxQP              int    // max_qp (RXE_MAX_QP)
	MaxQPWR            int    // max_qp_wr: deepest send or receive queue (RXE_MAX_QP_WR)
	MaxSGE             int    // max_sge: SGEs per send or receive WR (RXE_MAX_SGE)
	MaxSGERd           int    // max_sge_rd: SGEs per RDMA READ (RXE_MAX_SGE_RD)
	MaxCQ              int    // max_cq (RXE_MAX_CQ)
	MaxCQE             int    // max_cqe: entries per CQ ((1 << RXE_MAX_LOG_CQE) - 1)
	MaxMR              int    // max_mr (RXE_MAX_MR)
	MaxPD              int    // max_pd (RXE_MAX_PD)
	MaxQPRdAtom        int    // max_qp_rd_atom: reads/atomics a QP accepts at once (RXE_MAX_QP_RD_ATOM)
	MaxQPInitRdAtom    int    // max_qp_init_rd_atom: reads/atomics a QP issues at once (RXE_MAX_QP_INIT_RD_ATOM)
	MaxResRdAtom       int    // max_res_rd_atom: device-wide responder resources (RXE_MAX_RES_RD_ATOM)
	AtomicCap          int    // IBV_ATOMIC_HCA = 1
	MaxMW              int    // max_mw (RXE_MAX_MW)
	MaxSRQ             int    // max_srq (RXE_MAX_SRQ)
	MaxSRQWR           int    // max_srq_wr (RXE_MAX_SRQ_WR)
	MaxSRQSGE          int    // max_srq_sge (RXE_MAX_SRQ_SGE)
	MaxPKeys           int    // max_pkeys (RXE_MAX_PKEYS)
	LocalCAAckDelay    int    // local_ca_ack_delay (RXE_LOCAL_CA_ACK_DELAY)
	PhysPortCnt        int    // phys_port_cnt: always 1
	MaxInlineData      int    // max_inline_data per send WR (RXE_MAX_INLINE_DATA)
	MaxMsgSize         uint64 // largest message in bytes, as the port reports it
	DeviceCapFlags     uint64 // device_cap_flags: rxe's (Device* bits)
	MaxFastRegPageList int    // max_fast_reg_page_list_len (RXE_MAX_FMR_PAGE_LIST_LEN)
	// multicast (mcast.go): groups, QPs per group, attachments in all
	MaxMcastGrp           int // max_mcast_grp (RXE_MAX_MCAST_GRP)
	MaxMcastQPAttach      int // max_mcast_qp_attach: QPs per group (RXE_MAX_MCAST_QP_ATTACH)
	MaxTotalMcastQPAttach int // max_total_mcast_qp_attach (RXE_MAX_TOT_MCAST_QP_ATTACH)
}

// QueryDevice returns the device attributes (ibv_query_device).
func (d *Device) QueryDevice() DeviceAttr {
	guid := uint64(0)
	if len(d.gids) > 0 {
		b := d.gids[0].As16()
		// rxe derives the node GUID from the MAC address; we have none,
		// so derive a stable EUI-64-like value from the first address.
		for _, x := range b[8:] {
			guid = guid<<8 | uint64(x)
		}
		guid |= 0x0200000000000000
	}
	return DeviceAttr{
		FwVer: "0.0.0", NodeGUID: guid, SysImageGUID: guid,
		MaxMRSize: ^uint64(0), PageSizeCap: 0xfffff000, VendorID: 0xFFFFFF,
		MaxQP: 0x10000, MaxQPWR: int(qp.DefaultLimits.MaxQPWR), MaxSGE: int(qp.DefaultLimits.MaxSendSGE),
		MaxSGERd: 32, MaxCQ: 0x4000, MaxCQE: qp.MaxCQE, MaxMR: 0x4000, MaxPD: 0x7ffc,
		MaxQPRdAtom: int(qp.DefaultLimits.MaxQPRdAtom), MaxQPInitRdAtom: int(qp.DefaultLimits.MaxQPInitRdAtom), MaxResRdAtom: 0x3f000, AtomicCap: 1,
		MaxMW: 0x1000, MaxSRQ: 0x4000, MaxSRQWR: qp.MaxSRQWR, MaxSRQSGE: qp.MaxSRQSGE,
		MaxPKeys: 64, LocalCAAckDelay: 15, PhysPortCnt: 1,
		MaxInlineData: int(qp.DefaultLimits.MaxInlineData), MaxMsgSize: portMaxMsgSz,
		DeviceCapFlags: deviceCapFlags, MaxFastRegPageList: 512,
		MaxMcastGrp: MaxMcastGrp, MaxMcastQPAttach: MaxMcastQPAttach, MaxTotalMcastQPAttach: MaxTotalMcastQPAttach,
	}
}

// portMaxMsgSz is the port's max_msg_sz (RXE_PORT_MAX_MSG_SZ).
const portMaxMsgSz = 0x800000

// Device capability bits (enum ibv_device_cap_flags, the values the
// kernel's ib_uverbs_query_device passes to libibverbs).
const (
	DeviceBadPKeyCntr      uint64 = 1 << 1  // IBV_DEVICE_BAD_PKEY_CNTR
	DeviceBadQKeyCntr      uint64 = 1 << 2  // IBV_DEVICE_BAD_QKEY_CNTR
	DeviceAutoPathMig      uint64 = 1 << 4  // IBV_DEVICE_AUTO_PATH_MIG
	DeviceChangePhyPort    uint64 = 1 << 5  // IBV_DEVICE_CHANGE_PHY_PORT
	DeviceUDAVPortEnforce  uint64 = 1 << 6  // IBV_DEVICE_UD_AV_PORT_ENFORCE
	DevicePortActiveEvent  uint64 = 1 << 10 // IBV_DEVICE_PORT_ACTIVE_EVENT
	DeviceSysImageGUID     uint64 = 1 << 11 // IBV_DEVICE_SYS_IMAGE_GUID
	DeviceRCRNRNAKGen      uint64 = 1 << 12 // IBV_DEVICE_RC_RNR_NAK_GEN
	DeviceSRQResize        uint64 = 1 << 13 // IBV_DEVICE_SRQ_RESIZE: SRQ.Modify with SRQMaxWR
	DeviceMemWindow        uint64 = 1 << 17 // IBV_DEVICE_MEM_WINDOW
	DeviceMemMgtExtensions uint64 = 1 << 21 // IBV_DEVICE_MEM_MGT_EXTENSIONS: fast registration, LOCAL_INV
	DeviceMemWindowType2A  uint64 = 1 << 23 // IBV_DEVICE_MEM_WINDOW_TYPE_2A
	DeviceMemWindowType2B  uint64 = 1 << 24 // IBV_DEVICE_MEM_WINDOW_TYPE_2B
)

// deviceCapFlags is rdma_rxe 6.1's RXE_DEVICE_CAP_FLAGS (rxe_param.h;
// IB_DEVICE_ALLOW_USER_UNREG went to kernel_cap_flags in 6.0), which a
// C program reads from ibv_query_device on rxe before it resizes an SRQ
// or binds a window.
const deviceCapFlags = DeviceBadPKeyCntr | DeviceBadQKeyCntr | DeviceAutoPathMig | DeviceChangePhyPort |
	DeviceUDAVPortEnforce | DevicePortActiveEvent | DeviceSysImageGUID | DeviceRCRNRNAKGen |
	DeviceSRQResize | DeviceMemMgtExtensions | DeviceMemWindow | DeviceMemWindowType2A | DeviceMemWindowType2B

// PortState is enum ibv_port_state.
type PortState int

// Port states.
const (
	PortDown   PortState = 1
	PortActive PortState = 4
)

// PortAttr is struct ibv_port_attr (the fields that matter here).
type PortAttr struct {
	State       PortState // state: PortActive once the device is open
	MaxMTU      MTU       // max_mtu: MTU4096
	ActiveMTU   MTU       // active_mtu: Config.ActiveMTU
	GIDTblLen   int       // gid_tbl_len
	PKeyTblLen  int       // pkey_tbl_len: 1 (only the default P_Key)
	MaxMsgSz    uint64    // max_msg_sz
	LinkLayer   string    // "Ethernet"
	ActiveSpeed string    // active speed; "software" for a software device
	UDPPort     uint16    // UDP port the device receives on (4791 unless configured)
	// BadPKeyCntr and QKeyViolCntr are bad_pkey_cntr and qkey_viol_cntr:
	// the packets a QP refused for their P_Key or Q_Key (the drop_pkey
	// and drop_qkey counters; a multicast datagram counts once per
	// attached QP that refuses it), stopping at 0xFFFF, as rxe's
	// check_keys counts them (set_bad_pkey_cntr, set_qkey_viol_cntr).
	// The device advertises both (DeviceBadPKeyCntr, DeviceBadQKeyCntr).
	BadPKeyCntr, QKeyViolCntr uint32
}

// portCntrMax is where rxe's port counters stop (16-bit PortCounters
// fields: set_bad_pkey_cntr's min(0xffff, cntr + 1)).
const portCntrMax = 0xFFFF

// QueryPort returns port 1's attributes (ibv_query_port).
func (d *Device) QueryPort(port uint8) (PortAttr, error) {
	if port != 1 {
		return PortAttr{}, fmt.Errorf("ib: QueryPort: no port %d", port)
	}
	if err := d.checkOpen(); err != nil {
		return PortAttr{}, err
	}
	l := &qp.DefaultLimits
	return PortAttr{State: PortActive, MaxMTU: l.MaxMTU, ActiveMTU: d.mtu, GIDTblLen: l.GIDTableLen,
		PKeyTblLen: int(l.PKeyTableLen), MaxMsgSz: portMaxMsgSz, LinkLayer: "Ethernet", ActiveSpeed: "software", UDPPort: d.port,
		BadPKeyCntr: uint32(min(d.eng.Drops(qp.DropPKey), portCntrMax)), QKeyViolCntr: uint32(min(d.eng.Drops(qp.DropQKey), portCntrMax))}, nil
}

// AllocPD allocates a protection domain (ibv_alloc_pd).
func (d *Device) AllocPD() (*PD, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	p, err := d.eng.Memory().AllocPD()
	if err != nil {
		return nil, wrap("AllocPD", err)
	}
	return &PD{d: d, pd: p}, nil
}
