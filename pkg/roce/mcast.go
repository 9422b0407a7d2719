package roce

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
)

// UD multicast, as rdma_rxe does it (rxe_mcast.c, rxe_recv.c).
//
// A UD QP is attached to a multicast GID (ibv_attach_mcast); a datagram
// sent to the GID's IP address with destination QP 0xFFFFFF
// (IB_MULTICAST_QPN) is handed to every QP attached to that group on the
// receiving device, each checking it as its own (type, state, P_Key,
// Q_Key: rxe_rcv_mcast_pkt runs check_type_state and check_keys per QP
// and skips the QPs that refuse it). Everything up to the fan-out (parse,
// ICRC) happens once per datagram.
//
// Loopback: rxe has no special case. The datagram goes out to the group's
// IP address, and the host's IP stack loops a copy back to the local
// members (IP_MULTICAST_LOOP, on by default), so the sender's own device
// receives it like any other member: its QPs attached to the group,
// the sending QP included, get the datagram if they pass the checks (a
// sender that must not hear itself posts no receives, as mckey's sender).
// rxed behaves the same through its transport: MemNetwork delivers a
// group's datagram to the sending Conn when it is a member, and a UDP
// socket's copy is looped back by the kernel.
//
// Membership of the host: rxe's attach only adds the Ethernet multicast
// filter; the IP membership (IGMP / MLD) is rdma_cm's (cma_igmp_send). A
// userspace engine receives nothing without it, so the engine joins the
// group on its Conn when the first QP attaches and leaves when the last
// one detaches (transport.JoinGroup); a Conn that cannot join makes the
// attach fail.
//
// Counting, as rxe: rcvd_pkts counts the datagram once before the
// fan-out; an attached QP that refuses it for its P_Key or Q_Key counts
// drop_pkey or drop_qkey (rxe's bad_pkey_cntr / qkey_viol_cntr, which
// pkg/ib's QueryPort reports from them), one that refuses it for its type
// or state counts no drop (mcast_skipped; rxe counts it nowhere). A
// datagram for a group that has no QP attached counts mcast_no_member.

// McastQPN is the destination QP number of a multicast datagram
// (IB_MULTICAST_QPN).
const McastQPN = 0xFFFFFF

// Multicast limits, rdma_rxe's (rxe_param.h).
const (
	MaxMcastGroups        = 8192    // max_mcast_grp (RXE_MAX_MCAST_GRP)
	MaxMcastQPAttach      = 56      // max_mcast_qp_attach: QPs per group (RXE_MAX_MCAST_QP_ATTACH)
	MaxTotalMcastQPAttach = 0x70000 // max_total_mcast_qp_attach (RXE_MAX_TOT_MCAST_QP_ATTACH)
)

// Errors of AttachMcast and DetachMcast (rxe's -EINVAL and -ENOMEM cases).
var (
	ErrNotMcastGID    = errors.New("roce: not a multicast GID")
	ErrMcastQPType    = errors.New("roce: only UD QPs attach to multicast groups")
	ErrNotAttached    = errors.New("roce: QP is not attached to the group")
	ErrMcastGroups    = errors.New("roce: too many multicast groups")
	ErrMcastGroupFull = errors.New("roce: too many QPs attached to the group")
)

// mcastTable is an engine's multicast groups.
//
// Locking: mu guards groups, total and closed; it is held across a join or
// leave (system calls, rare). A group's qps slice is copied on write, so
// the worker fanning a datagram out reads a snapshot taken under mu and
// iterates it without the lock.
//
// Close (leaveAll) sets closed and leaves every group under mu, then waits
// for loops: a join under mu either comes before (its loop is counted and
// its socket closed by leaveAll) or sees closed and fails, so no group
// receive loop outlives Engine.Close.
type mcastTable struct {
	mu     sync.Mutex
	groups map[netip.Addr]*mcastGroup // by group IP address (unmapped)
	total  int                        // attachments over all groups
	closed bool                       // Engine.Close left every group: no join after
	loops  sync.WaitGroup             // group receive loops (startGroupLoop); Add under mu
}

// mcastGroup is one group: its attached QPs and the transport membership.
type mcastGroup struct {
	qps []*qp.QP // in attach order; copy on write
	mem *transport.Membership
}

// mcastGroupAddr checks a multicast GID and returns its IP address.
func mcastGroupAddr(gid netip.Addr) (netip.Addr, error) {
	if !transport.IsGroup(gid) {
		return netip.Addr{}, fmt.Errorf("%w: %v", ErrNotMcastGID, gid)
	}
	return gid.Unmap(), nil
}

// AttachMcast attaches the UD QP q to the multicast group gid
// (ibv_attach_mcast; an IPv4 group as its IPv4-mapped GID or plain).
// Attaching twice is not an error, as in rxe. The first QP attached to a
// group makes the engine's Conn join it. A QP that DestroyQP closed is
// refused with qp.ErrDestroyed, so no attach outlives the destroy's
// detach.
func (e *Engine) AttachMcast(q *qp.QP, gid netip.Addr) error {
	group, err := mcastGroupAddr(gid)
	if err != nil {
		return err
	}
	if q.Type() != qp.UD {
		return fmt.Errorf("%w (QP %#x is %v)", ErrMcastQPType, q.Num(), q.Type())
	}
	select {
	case <-e.closed:
		return ErrClosed
	default:
	}
	t := &e.mcast
	t.mu.Lock()
	defer t.mu.Unlock()
	// Under mu: DestroyQP closes q before its detachAll takes mu, so an
	// attach racing the destroy either lands before that detach (which
	// undoes it) or sees q closed here.
	if q.Closed() {
		return fmt.Errorf("%w: QP %#x", qp.ErrDestroyed, q.Num())
	}
	// Under mu too: a Close that ran since the check above has left every
	// group and waits for their loops, so a join now would outlive it.
	if t.closed {
		return ErrClosed
	}
	g := t.groups[group]
	if g != nil {
		for _, a := range g.qps {
			if a == q {
				return nil
			}
		}
		if len(g.qps) >= MaxMcastQPAttach {
			return fmt.Errorf("%w: %v has %d (max_mcast_qp_attach)", ErrMcastGroupFull, group, len(g.qps))
		}
	} else if len(t.groups) >= MaxMcastGroups {
		return fmt.Errorf("%w: %d (max_mcast_grp)", ErrMcastGroups, len(t.groups))
	}
	if t.total >= MaxTotalMcastQPAttach {
		return fmt.Errorf("%w: %d attachments (max_total_mcast_qp_attach)", ErrMcastGroupFull, t.total)
	}
	if g == nil {
		mem, err := transport.JoinGroup(e.conn, group)
		if err != nil {
			return fmt.Errorf("roce: AttachMcast %v: %w", group, err)
		}
		g = &mcastGroup{mem: mem}
		if t.groups == nil {
			t.groups = make(map[netip.Addr]*mcastGroup)
		}
		t.groups[group] = g
		if mem.Conn != nil {
			e.groupTraffic(mem.Conn)
			t.loops.Add(1) // under mu, before leaveAll's Wait (closed is false)
			e.startGroupLoop(mem)
		}
		e.log.Debug("roce: joined multicast group", "group", group)
	}
	g.qps = append(g.qps[:len(g.qps):len(g.qps)], q) // copy on write
	t.total++
	return nil
}

// DetachMcast detaches q from gid (ibv_detach_mcast); ErrNotAttached if it
// was not attached. The last QP's detach makes the Conn leave the group.
func (e *Engine) DetachMcast(q *qp.QP, gid netip.Addr) error {
	group, err := mcastGroupAddr(gid)
	if err != nil {
		return err
	}
	t := &e.mcast
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.detachLocked(e, q, group) {
		return fmt.Errorf("%w: QP %#x, group %v", ErrNotAttached, q.Num(), group)
	}
	return nil
}

// detachAll detaches q from every group (DestroyQP; rxe_drop_all_mcast_groups).
func (t *mcastTable) detachAll(e *Engine, q *qp.QP) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for group := range t.groups {
		t.detachLocked(e, q, group)
	}
}

// detachLocked removes q from group (under mu), leaving a group left
// empty; false if q was not attached.
func (t *mcastTable) detachLocked(e *Engine, q *qp.QP, group netip.Addr) bool {
	g := t.groups[group]
	if g == nil {
		return false
	}
	for i, a := range g.qps {
		if a != q {
			continue
		}
		qps := make([]*qp.QP, 0, len(g.qps)-1)
		g.qps = append(append(qps, g.qps[:i]...), g.qps[i+1:]...)
		t.total--
		if len(g.qps) == 0 {
			delete(t.groups, group)
			if err := g.mem.Leave(); err != nil {
				e.log.Debug("roce: leaving multicast group", "group", group, "err", err)
			}
			e.log.Debug("roce: left multicast group", "group", group)
		}
		return true
	}
	return false
}

// leaveAll ends every group's membership (Engine.Close) and waits for the
// groups' receive loops, which end when their sockets close. The groups
// stay in the table (McastGroups, DetachMcast and DestroyQP's detach work
// as before; Leave again is a no-op); no group is joined after. The wait
// is outside mu: a loop's enqueue may wait for a worker, which takes mu
// (members), and fails once Engine.closed is closed, as it is by now.
func (t *mcastTable) leaveAll(e *Engine) {
	t.mu.Lock()
	t.closed = true
	for group, g := range t.groups {
		if err := g.mem.Leave(); err != nil {
			e.log.Debug("roce: leaving multicast group", "group", group, "err", err)
		}
	}
	t.mu.Unlock()
	t.loops.Wait()
}

// McastGroups returns the number of QPs attached to each group.
func (e *Engine) McastGroups() map[netip.Addr]int {
	t := &e.mcast
	t.mu.Lock()
	defer t.mu.Unlock()
	m := make(map[netip.Addr]int, len(t.groups))
	for a, g := range t.groups {
		m[a] = len(g.qps)
	}
	return m
}

// members returns the QPs attached to group (a snapshot, not to be
// modified).
func (t *mcastTable) members(group netip.Addr) []*qp.QP {
	t.mu.Lock()
	defer t.mu.Unlock()
	if g := t.groups[group]; g != nil {
		return g.qps
	}
	return nil
}

// startGroupLoop receives a membership's own Conn (a UDP socket bound to
// the group) until Leave (the last detach, or leaveAll in the engine's
// Close) closes it, and hands each datagram to a worker exactly as the
// main receive loop would (by destination QP number: 0xFFFFFF fans out in
// handleMcast). The caller counted the loop in mcast.loops.
func (e *Engine) startGroupLoop(mem *transport.Membership) {
	c := mem.Conn
	go func() {
		defer e.mcast.loops.Done()
		bs := c.BatchSize()
		if bs <= 0 {
			bs = transport.DefaultBatchSize
		}
		pkts := make([][]byte, bs)
		eps := make([]transport.Endpoint, bs)
		leases := make([]*transport.Lease, bs)
		lender := transport.Lend(c)
		for {
			n, err := lender.ReceiveLent(pkts, eps, leases)
			if err != nil {
				return
			}
			for i := 0; i < n; i++ {
				pkt, lease := pkts[i], leases[i]
				pkts[i], leases[i] = nil, nil
				if len(pkt) < wire.BTHLen+wire.ICRCLen {
					e.drop(qp.DropLength)
					lease.Release()
					continue
				}
				w := e.workerFor(wire.BTH(pkt[:wire.BTHLen]).DestQP())
				if !w.enqueue(event{kind: evPacket, pkt: pkt, ep: eps[i], lease: lease}) {
					lease.Release()
					for j := i + 1; j < n; j++ {
						leases[j].Release()
						pkts[j], leases[j] = nil, nil
					}
					return
				}
			}
		}
	}()
}

// handleMcast is handlePacket for a datagram to QP 0xFFFFFF: parse and
// ICRC once, then every QP attached to the destination group checks and
// receives it on its own worker (rxe_rcv_mcast_pkt). pkt is borrowed as
// in handlePacket: QPs of other shards get copies.
func (w *worker) handleMcast(pkt []byte, ep *transport.Endpoint) {
	e := w.e
	dst := ep.Local.Addr()
	if !transport.IsGroup(dst) && !e.isLocal(dst) {
		e.drop(qp.DropAddress)
		return
	}
	p := &w.pkt
	if err := p.Parse(pkt); err != nil {
		e.drop(parseDrop(err))
		return
	}
	if r := w.checkICRC(p.Raw, ep); r != qp.DropNone {
		e.drop(r)
		return
	}
	// rcvd_pkts counts the datagram once, whoever takes it, as rxe_rcv
	// does before rxe_rcv_mcast_pkt looks for the group.
	w.ctr.RcvdPkts.Add(1)
	ri := w.ri // the solved IPv4 header fields, for each member's GRH
	// and the TOS and TTL received (groupTraffic has the group's Conn
	// report them), as handlePacket's: w.ri holds another datagram's.
	ri.Src, ri.Dst = ep.Remote, ep.Local
	ri.TrafficClass, ri.HopLimit, ri.FlowLabel = ep.TrafficClass, ep.HopLimit, ep.FlowLabel
	members := e.mcast.members(dst.Unmap())
	if len(members) == 0 {
		if transport.IsGroup(dst) {
			// A group with no member here: the last QP just detached
			// (our own looped-back datagrams after a leave, or a peer's
			// still arriving). rdma_rxe drops these without counting a
			// drop; so do we, under a counter of their own.
			e.mcastNoMember.Add(1)
			return
		}
		e.drop(qp.DropQP) // QP 0xFFFFFF at a unicast destination
		return
	}
	for _, q := range members {
		tw := e.workerFor(q.Num())
		if tw == w {
			w.deliverMcast(q, p, &ri)
			continue
		}
		// Another shard: a copy, handed over without waiting (two workers
		// fanning out to each other must not block on each other's full
		// inbox). UD is unreliable; a full inbox drops the copy.
		cp := append([]byte(nil), pkt...)
		cri := ri
		if !tw.offer(event{kind: evCall, fn: func() { tw.deliverMcastCopy(q, cp, &cri) }}) {
			e.drop(qp.DropOverrun)
		}
	}
}

// deliverMcastCopy parses a copy handed over by another shard's
// handleMcast and delivers it (on tw, the QP's worker).
func (w *worker) deliverMcastCopy(q *qp.QP, pkt []byte, ri *qp.RecvInfo) {
	if err := w.pkt.Parse(pkt); err != nil {
		w.e.drop(parseDrop(err)) // parsed once already: cannot happen
		return
	}
	w.deliverMcast(q, &w.pkt, ri)
}

// deliverMcast runs one attached QP's checks and receive for a multicast
// datagram (on the QP's worker); ri is what handleMcast learnt of it.
func (w *worker) deliverMcast(q *qp.QP, p *wire.Packet, ri *qp.RecvInfo) {
	ent := w.entryOf(q)
	if ent == nil {
		return // destroyed meanwhile
	}
	w.ri = *ri
	if r := q.Check(p, &w.ri, netip.Addr{}); r != qp.DropNone {
		// rxe_rcv_mcast_pkt skips the QP: a P_Key or Q_Key refusal is
		// counted in the port's bad_pkey_cntr or qkey_viol_cntr
		// (check_keys; drop_pkey, drop_qkey here), a type or state one
		// nowhere. The datagram is in rcvd_pkts already.
		if r == qp.DropPKey || r == qp.DropQKey {
			w.e.drop(r)
		} else {
			w.e.mcastSkipped.Add(1)
		}
		return
	}
	q.ReceiveCopy(w, p, &w.ri, w.clockNow()) // counted once in handleMcast
	w.runQP(ent)
}
