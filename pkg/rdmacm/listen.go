package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/rxed/rxed/pkg/cm"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/wire/mad"
)

// ListenOptions configures Listen; the zero value is rdma_listen's but
// for the backlog's size (Backlog).
type ListenOptions struct {
	// PortSpace: 0 is mad.PortSpaceTCP (RC/UC connections); a listener in
	// mad.PortSpaceUDP answers SIDR requests (UD, Request.AcceptUD).
	PortSpace mad.PortSpace
	// Backlog is how many requests may wait for Accept. A connection
	// request beyond it is dropped without an answer, as the kernel's
	// full backlog (ucma's handler fails with -ENOMEM and cm.c sends no
	// REJ, "to allow future retries"): the peer's REQ retransmission is
	// taken as a new request, queued if Accept has made room by then
	// (counted req_dropped in Counters). A UD request (SIDR_REQ) beyond
	// it is refused with SIDR_REP REJECT, as cm.c answers any SIDR_REQ
	// its consumer fails. 0 means 64, not rdma_listen's 0 (ucma's
	// max_backlog, 1024): every queued request is a passive connection
	// the CM counts against Config.MaxHalfOpen (1024 by default), and a
	// backlog that large would let one listener's queue take every
	// half-open place of the device, so that the CM refuses (REJ 3) every
	// other REQ before the backlog's eviction can make room for another
	// source. A queued REQ whose active side can no longer be waiting
	// (its retries, by the REQ's timeouts and Max CM Retries, are over;
	// 2 minutes after it came at most, whatever those say) holds no
	// place: it is refused with REJ 28 when that time comes, on the CM's
	// clock (req_expired in Counters; listen_expiry.go); so is a queued
	// SIDR_REQ 65.5 s after it came, when rdma_cm's requester has given
	// up, with SIDR_REP REJECT.
	Backlog int
	// MaxPerSource, if set, is how many of the Backlog requests one
	// source IP address may hold: one more from it is turned away as
	// over a full backlog, even while the backlog has room (req_source_full
	// in Counters). 0 (or less, as for Backlog, or Backlog or more) sets no such cap: a source may
	// take whatever room there is, so a host opening many connections at
	// once has them all queued. Either way a full backlog makes room for a
	// source that holds at least two fewer than the heaviest one by
	// refusing (REJ 28) the heaviest one's oldest request (req_evicted in
	// Counters), so REQs forged from one address cannot keep a real client
	// out (listen_backlog.go, docs/security.md).
	MaxPerSource int
}

// Listener accepts rdma_cm connection requests for one address and port.
// Its methods are safe for concurrent use.
type Listener struct {
	a    *agent
	addr netip.AddrPort
	ps   mad.PortSpace
	sid  uint64

	reqs *backlog

	closeOnce sync.Once
	closed    chan struct{}
}

// Listen starts listening for rdma_cm connection requests on addr (IP and
// port; an unspecified IP, 0.0.0.0 or ::, covers every GID of the device).
// opts may be nil.
func Listen(dev *ib.Device, addr netip.AddrPort, opts *ListenOptions) (*Listener, error) {
	if opts == nil {
		opts = &ListenOptions{}
	}
	if dev == nil {
		return nil, fmt.Errorf("rdmacm: Listen: nil device")
	}
	if addr.Port() == 0 {
		return nil, fmt.Errorf("rdmacm: Listen %v: a port is required", addr)
	}
	ip := addr.Addr().Unmap()
	if !ip.IsValid() {
		return nil, fmt.Errorf("rdmacm: Listen %v: invalid address", addr)
	}
	if !ip.IsUnspecified() && dev.GIDIndex(ip) < 0 {
		return nil, fmt.Errorf("rdmacm: Listen %v: not an address of the device (GIDs %v)", addr, dev.GIDs())
	}
	ps := opts.PortSpace
	if ps == 0 {
		ps = mad.PortSpaceTCP
	}
	backlog := opts.Backlog
	if backlog <= 0 {
		backlog = 64
	}
	a, err := acquire(dev)
	if err != nil {
		return nil, fmt.Errorf("rdmacm: Listen: %w", err)
	}
	l := &Listener{a: a, addr: netip.AddrPortFrom(ip, addr.Port()), ps: ps, sid: serviceID(ps, addr.Port()),
		reqs: newBacklog(backlog, opts.MaxPerSource), closed: make(chan struct{})}
	l.reqs.expireWith(a.clock, l.expire)
	if err := a.addListener(l); err != nil {
		return nil, fmt.Errorf("rdmacm: Listen %v: %w", addr, err)
	}
	return l, nil
}

// Addr returns the listener's address.
func (l *Listener) Addr() netip.AddrPort { return l.addr }

// Accept waits for the next connection request. It fails with ErrClosed
// once the listener is closed, ib.ErrDeviceClosed once its device is
// (rdma_cm's RDMA_CM_EVENT_DEVICE_REMOVAL), or ctx's error. A request
// whose peer has given up by its REQ's timeouts (a SIDR_REQ's: by
// rdma_cm's) is skipped (refused with REJ 28, SIDR_REP REJECT:
// listen_expiry.go), so that the caller does not spend a REP timeout on
// it before reaching the next.
func (l *Listener) Accept(ctx context.Context) (*Request, error) {
	for {
		if err := l.ended(); err != nil {
			return nil, err
		}
		r, expired := l.reqs.take(l.a.clock.Now())
		l.expire(expired)
		if r != nil {
			return r, nil
		}
		select {
		case <-l.reqs.ready:
		case <-l.closed: // ended says which, both may have happened
		case <-l.a.gone:
		case <-ctx.Done():
			return nil, qp.ContextError(ctx)
		}
	}
}

// ended is why Accept hands out nothing more, nil while it may: the
// listener's own Close (ErrClosed) before its device's (the device's
// close refused what was queued, and a request taken now would be one of
// a closed CM: ib.ErrDeviceClosed). Both may have happened by the time
// Accept looks; a select on both picked either at random, so a caller
// that closed its listener on the device's close saw one error or the
// other from run to run.
func (l *Listener) ended() error {
	select {
	case <-l.closed:
		return ErrClosed
	default:
	}
	select {
	case <-l.a.gone:
		return ib.ErrDeviceClosed
	default:
	}
	return nil
}

// Close stops the listener; requests not yet accepted are rejected.
// Connections already accepted live on.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.closed)
		l.a.removeListener(l)
		l.rejectQueued(rejectRequest)
	})
	return nil
}

// offer queues r for Accept; false when the queue is full. A listener
// closed meanwhile answers r itself: Close drains the queue once, and a
// request the CM's handler routed here just before Close and queued just
// after Close's drain would otherwise wait unanswered, half open in the
// CM for good (TestListenerClosedBeforeItsRequestWasQueued). Close closes
// closed before it drains, so the drain or this check sees every request.
func (l *Listener) offer(r *Request, reject func(*Request)) bool {
	if !l.reqs.push(r) {
		return false
	}
	select {
	case <-l.closed:
		l.rejectQueued(reject)
	default:
	}
	return true
}

// rejectQueued answers every request queued for Accept with reject.
func (l *Listener) rejectQueued(reject func(*Request)) {
	for r := l.reqs.pop(); r != nil; r = l.reqs.pop() {
		reject(r)
	}
}

// rejectRequest refuses a request nobody will accept.
func rejectRequest(r *Request) { _ = r.Reject(nil) }

// takes reports whether l takes a request whose rdma_cm header has IP
// version v and names dst (unmapped) as its destination, as
// cma_match_private_data matches a listener to a header: by the header's
// IP version and destination, never by the GRH. An IPv4 listener takes
// version 4 headers only (rdma_bind_addr sets afonly for AF_INET), an
// IPv6 one version 6 headers only, a bound one only those naming its
// address; :: takes every header (afonly 0, net.ipv6.bindv6only's
// default). So a version 6 header naming an IPv4-mapped address
// (::ffff:a.b.c.d: cma_save_ip6_info keeps all 16 bytes) reaches a ::
// listener, as IPv4 in the unmapped form of every address here, and no
// IPv4 one.
func (l *Listener) takes(v uint8, dst netip.Addr) bool {
	ip := l.addr.Addr()
	switch {
	case ip.IsUnspecified() && ip.Is6():
		return true
	case ip.Is4() != (v == 4):
		return false
	case ip.IsUnspecified():
		return true
	}
	return ip == dst
}

// addListener registers l under its service ID, creating the CM listener
// for the port on first use.
func (a *agent) addListener(l *Listener) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	sl := a.listeners[l.sid]
	if sl == nil {
		cml, err := a.cm.Listen(l.sid, 0, a.onListenEvent)
		if err != nil {
			return cmErr(err)
		}
		sl = &serviceListeners{cml: cml}
		a.listeners[l.sid] = sl
	}
	for _, o := range sl.byIP {
		if o.addr.Addr() == l.addr.Addr() {
			return ErrAddrInUse
		}
	}
	sl.byIP = append(sl.byIP, l)
	return nil
}

func (a *agent) removeListener(l *Listener) {
	a.mu.Lock()
	defer a.mu.Unlock()
	sl := a.listeners[l.sid]
	if sl == nil {
		return
	}
	for i, o := range sl.byIP {
		if o == l {
			sl.byIP = append(sl.byIP[:i], sl.byIP[i+1:]...)
			break
		}
	}
	if len(sl.byIP) == 0 {
		_ = sl.cml.Close()
		delete(a.listeners, l.sid)
	}
}

// route picks the listener on service sid for a request whose rdma_cm
// header has IP version v and destination dst (unmapped): one bound to
// the address first, then an unspecified one (takes).
func (a *agent) route(sid uint64, v uint8, dst netip.Addr) *Listener {
	a.mu.Lock()
	defer a.mu.Unlock()
	sl := a.listeners[sid]
	if sl == nil {
		return nil
	}
	var wild *Listener
	for _, l := range sl.byIP {
		switch {
		case !l.takes(v, dst):
		case !l.addr.Addr().IsUnspecified():
			return l
		case wild == nil:
			wild = l
		}
	}
	return wild
}

// onListenEvent receives the REQs and SIDR_REQs of every rdma_cm port of
// the device (cma_ib_req_handler, cma_ib_handler's SIDR half): it checks
// rdma_cm's header (its version, and that its source is the address the
// request came from: fromHeaderSource), picks the listener by the
// header's IP version and destination (route), checks that destination
// is a GID of the device, and queues a Request, or rejects.
func (a *agent) onListenEvent(ev cm.Event) {
	var priv []byte
	switch ev.Type {
	case cm.EventREQ:
		priv = ev.REQ.PrivateData
	case cm.EventSIDRREQ:
		priv = ev.SIDRREQ.PrivateData
	default:
		return
	}
	// A refusal from here leaves from REQ_RCVD, as the kernel's when
	// cma_ib_req_handler fails the REQ event (with anything but ucma's
	// -ENOMEM of a full backlog, which sends nothing: below): the REJ
	// names no local comm ID (cm_format_rej). One the application
	// answers later leaves from MRA_REQ_SENT (below).
	refuse := func() {
		if ev.Type == cm.EventSIDRREQ {
			_ = ev.ID.SIDRReply(cm.SIDRReplyParams{Status: mad.SIDRReject})
		} else {
			_ = ev.ID.Reject(mad.REJConsumerDefined, nil, nil)
		}
	}
	// ParseCMAHeader refuses what cma_save_ip_info does: a version
	// other than 0, an IP version other than 4 or 6.
	hdr, err := mad.ParseCMAHeader(priv)
	if err != nil {
		refuse()
		return
	}
	if !fromHeaderSource(hdr, ev.ID.RemoteAddr()) {
		a.srcMismatch.Add(1)
		a.log.Debug("rdmacm: refused a request whose header names another source than it came from",
			"header_src", hdr.Src, "grh_src", ev.ID.RemoteAddr(), "dst", hdr.Dst, "service_id", ev.ID.ServiceID())
		refuse()
		return
	}
	dst := hdr.Dst.Unmap()
	l := a.route(ev.ID.ServiceID(), hdr.IPVersion, dst)
	if l == nil || (ev.Type == cm.EventSIDRREQ) != (l.ps == mad.PortSpaceUDP) {
		refuse()
		return
	}
	if a.dev.GIDIndex(dst) < 0 {
		// cma_ib_acquire_dev: the connection's source, the header's
		// destination, must be a GID of the port the request came to
		// (cma_validate_port), or the handler fails: REJ 28. Only a
		// wildcard listener can get here with such a header.
		refuse()
		return
	}
	// Room in the backlog (listen_backlog.go): only this handler queues
	// requests, and the device's cm.Manager runs its handlers one at a
	// time (Manager.drain), so the room admit sees or makes stays until
	// the offer below: Accept and rejectQueued only take requests out.
	// The REQ it turns away made no Conn.
	now := a.clock.Now()
	adm, victim, expired := l.reqs.admit(ev.ID.RemoteAddr().Unmap(), now)
	l.expire(expired)
	switch adm {
	case admitEvicted:
		a.reqEvicted.Add(1)
		a.log.Debug("rdmacm: a full backlog refused the oldest request of its heaviest source to make room for another source",
			"listener", l.addr, "refused", victim.peerGID, "for", ev.ID.RemoteAddr())
		rejectRequest(victim)
	case backlogFull, sourceFull:
		if adm == sourceFull {
			a.reqSourceFull.Add(1)
		}
		if ev.Type == cm.EventSIDRREQ {
			refuse()
			return
		}
		// ucma_connect_event_handler's -ENOMEM: no REJ, and nothing of
		// the REQ kept (cm_reset_to_idle), so its retransmission is a
		// new request that finds room once Accept has taken one.
		ev.ID.DestroyNoReject()
		return
	}
	r := &Request{l: l, id: ev.ID, ud: ev.Type == cm.EventSIDRREQ,
		Local:  netip.AddrPortFrom(dst, l.addr.Port()),
		Remote: netip.AddrPortFrom(hdr.Src.Unmap(), hdr.SrcPort),
		gid:    ev.ID.LocalAddr(), peerGID: ev.ID.RemoteAddr(),
		PrivateData: append([]byte(nil), priv[mad.CMAHeaderLen:]...)}
	r.expires = now.Add(sidrWaitBound)
	if !r.ud {
		r.req = ev.REQ
		r.expires = now.Add(reqResidency(ev.REQ))
		r.ResponderResources, r.InitiatorDepth = ev.REQ.ResponderResources, ev.REQ.InitiatorDepth
		r.RetryCount, r.RNRRetryCount = ev.REQ.RetryCount, ev.REQ.RNRRetryCount
		r.c = newConn(a, nil)
		r.c.id = ev.ID
		r.c.local, r.c.remote = r.Local, r.Remote
		ev.ID.SetHandler(r.c.onEvent)
		// cma_ib_req_handler arms the delayed MRA before librdmacm's
		// application can answer (rdma_accept waits for the handler):
		// armed after the offer, an answer quicker than this handler
		// would leave from REQ_RCVD or MRA_REQ_SENT by chance.
		_ = ev.ID.PrepareMRA()
	}
	if l.offer(r, rejectRequest) {
		return
	}
	// No room. Nothing gets here: admit found or made room above, and
	// nothing else puts requests in the backlog between the two (its
	// comment), so this would be that invariant broken (two CM handlers
	// at once): say so loudly, and answer the request rather than leave
	// it half open. A REQ's ID is in MRA_REQ_SENT now (PrepareMRA), so
	// the answer is a REJ, not DestroyNoReject's silence; a SIDR_REQ
	// gets SIDR_REP REJECT, as cm.c answers one its consumer fails.
	a.log.Error("rdmacm: internal error: a listener's backlog filled between the room check and the queueing of a request (CM handlers ran concurrently); the request is rejected",
		"listener", l.addr, "peer", ev.ID.RemoteAddr())
	refuse()
	if r.c != nil {
		r.c.fail(ErrRejected, false) // out of a.live, as Request.Reject does
	}
}

// Request is a connection request waiting for Accept or Reject
// (RDMA_CM_EVENT_CONNECT_REQUEST).
//
// Its methods are safe for concurrent use: the first of Accept,
// AcceptUD and Reject answers the request, any later one returns
// ErrAnswered. The exported fields are set before Listener.Accept
// returns it and are not changed afterwards.
type Request struct {
	// Local is the address and port the peer connected to; Remote the
	// peer's, both from rdma_cm's header. Listen refuses a request whose
	// header names another source address than the one it came from, so
	// Remote's address is RemoteQP's GID (unmapped).
	Local, Remote netip.AddrPort
	// PrivateData is the peer's private data after rdma_cm's header, whole
	// as on the wire (56 bytes for a REQ, 180 for a SIDR_REQ).
	PrivateData []byte
	// What the peer's REQ offered: its responder resources and initiator
	// depth, its retry counts.
	ResponderResources, InitiatorDepth, RetryCount, RNRRetryCount uint8

	l       *Listener
	id      *cm.ID
	req     *mad.REQ
	ud      bool
	c       *Conn // RC/UC: the connection Accept completes
	gid     netip.Addr
	peerGID netip.Addr
	// expires is when the request's active side has given up for sure,
	// on the CM's clock (reqResidency; sidrWaitBound for a UD request).
	expires time.Time

	mu       sync.Mutex
	answered bool
}

// UD reports whether this is a UD request (a SIDR_REQ: answer with
// AcceptUD).
func (r *Request) UD() bool { return r.ud }

// RemoteQP is the peer's GID (unmapped) and QP number as the REQ gives
// them: where the QP that Accept connects will send. Known before
// Accept, so that an application accounting for what it sends to the
// peer can start before the peer may send its first request (the REP
// lets it, before Accept returns). A UD request's QP number is 0.
func (r *Request) RemoteQP() (gid netip.Addr, qpn uint32) {
	if r.ud {
		return r.peerGID.Unmap(), 0
	}
	return r.peerGID.Unmap(), r.req.LocalQPN
}

// onOurDevice refuses a QP of another device than the one the request
// came to (rdma_create_qp's -EINVAL for a PD of another device than the
// cm_id's). Such a QP got a REP (or SIDR_REP) naming its number, and the
// peer then sent to that number at the listener's GID, where no such QP
// lives: the handshake succeeded and every send failed. The request
// stays unanswered, so a QP of the right device can still take it.
func (r *Request) onOurDevice(q *ib.QP) error {
	if d := q.PD().Device(); d != r.l.a.dev {
		return fmt.Errorf("QP %#x is on another device (GIDs %v) than the request, which came to %v", q.Num(), d.GIDs(), r.gid)
	}
	return nil
}

// answer marks the request answered, once.
func (r *Request) answer() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answered {
		return ErrAnswered
	}
	r.answered = true
	return nil
}

// Accept takes q (an RC or UC QP in RESET or INIT, of the listener's
// device; any other is refused, the request left unanswered) to RTS with the attributes the
// REQ and p imply, sends the REP, and returns once the connection is
// established: the RTU arrived, or q took the peer's first request
// (COMM_EST) when the RTU was lost. p may be nil (rdma_accept's defaults:
// the resources the REQ offered, RNR retry count 7 for the peer). On failure the peer gets a REJ, and q
// is left in ERR (rdma_accept's cma_modify_qp_err), so it sends nothing
// to a peer it is not connected to. A peer that gave up before or during
// Accept (its REJ: a Dial whose ctx ended, or its device closing) is a
// *RejectError, as rdma_cm reports RDMA_CM_EVENT_REJECTED; silence after
// the REP is ErrTimeout, the device's close ib.ErrDeviceClosed.
func (r *Request) Accept(ctx context.Context, q *ib.QP, p *ConnParam) (*Conn, error) {
	if r.ud {
		return nil, fmt.Errorf("rdmacm: Accept: a UD (SIDR) request is answered with AcceptUD")
	}
	if err := checkConnQP(q); err != nil {
		return nil, fmt.Errorf("rdmacm: Accept: %w", err)
	}
	if err := r.onOurDevice(q); err != nil {
		return nil, fmt.Errorf("rdmacm: Accept: %w", err)
	}
	if p == nil {
		p = defaultConnParam()
	}
	if len(p.PrivateData) > mad.REPPrivateLen {
		return nil, fmt.Errorf("rdmacm: Accept: %d bytes of private data (a REP carries at most %d)", len(p.PrivateData), mad.REPPrivateLen)
	}
	if err := r.answer(); err != nil {
		return nil, err
	}
	c := r.c
	// refuse answers the request with REJ 28 before our REP has gone.
	refuse := func(err error) (*Conn, error) {
		_ = r.id.Reject(mad.REJConsumerDefined, nil, nil)
		c.fail(err, false)
		return nil, fmt.Errorf("rdmacm: Accept: %w", err)
	}
	if err := qp.ContextError(ctx); err != nil {
		// Refused without a REP, as a wait its ctx ended gives the
		// connection up: a REP sent now could be answered by an RTU
		// before the wait looks at ctx, connecting an Accept that fails.
		return refuse(err)
	}
	c.qp = q
	dev := q.PD().Device()
	pp := acceptDefaults(dev, *p, r.req)
	if p.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, p.Timeout, errTimeoutParam)
		defer cancel()
	}
	psn := c.a.cm.NewPSN()
	s := passiveSetup(dev, &pp, r.gid, r.peerGID, r.req, psn)
	// The QP's first request from the peer tells the CM the connection
	// is up if the RTU was lost (ib_cm_notify(IB_EVENT_COMM_EST), as the
	// kernel's rdma_cm ULPs do from their QP event handler): the REP
	// stops and Accept returns, instead of waiting for the REP's
	// retransmission (4 s) while the peer's data sits in the QP.
	// Installed before the QP can take a request; once Accept returns
	// the handshake is over either way.
	defer q.OnEvent(func(ev ib.AsyncEvent) {
		if ev.Type == ib.EventCommEst {
			// cm.ErrAlreadyEstablished (the RTU came first: -EISCONN)
			// and ErrState (the handshake failed meanwhile) need
			// nothing done, as the kernel's ULPs ignore rdma_notify's.
			_ = r.id.Established()
		}
	})()
	c.movingQP()
	if err := ib.ConnectQP(q, s.remote, s.attr); err != nil {
		return refuse(err)
	}
	c.setPrivate(r.PrivateData)
	if err := r.id.Accept(cm.AcceptParams{QPN: q.Num(), StartingPSN: psn,
		ResponderResources: pp.ResponderResources, InitiatorDepth: pp.InitiatorDepth,
		RNRRetryCount: pp.RNRRetryCount, SRQ: usesSRQ(q), PrivateData: pp.PrivateData}); err != nil {
		if errors.Is(err, cm.ErrState) {
			// The ID left REQ_RCVD before our REP: the peer gave up (its
			// REJ; a Dial whose ctx ended destroys its ID with one). Say
			// so as Dial does, not with the CM's "invalid state".
			err = c.abandoned(ctx, err)
		}
		c.fail(err, true)
		return nil, fmt.Errorf("rdmacm: Accept: %w", err)
	}
	if err := c.await(ctx, nil); err != nil {
		return nil, fmt.Errorf("rdmacm: Accept: %w", err)
	}
	return c, nil
}

// Reject refuses the request with reason 28 (consumer defined) and
// privateData (at most 148 bytes), as rdma_reject; a UD request gets a
// SIDR_REP with status REJECT. A request whose peer gave up first (its
// REJ came in: a Dial whose ctx ended) needs no answer, and Reject
// returns nil; ErrAnswered if Accept or Reject answered it already.
func (r *Request) Reject(privateData []byte) error {
	limit := mad.REJPrivateLen
	if r.ud {
		limit = mad.SIDRREPPrivateLen
	}
	if len(privateData) > limit {
		return fmt.Errorf("rdmacm: Reject: %d bytes of private data (at most %d)", len(privateData), limit)
	}
	if err := r.answer(); err != nil {
		return err
	}
	if r.ud {
		return r.id.SIDRReply(cm.SIDRReplyParams{Status: mad.SIDRReject, PrivateData: privateData})
	}
	err := r.id.Reject(mad.REJConsumerDefined, nil, privateData)
	if errors.Is(err, cm.ErrState) {
		// The ID left REQ_RCVD before our REJ: the peer gave up first
		// (its REJ), and the request is refused either way.
		err = nil
	}
	r.c.fail(ErrRejected, false) // out of a.live
	return err
}

// AcceptUD answers a UD request (SIDR_REQ) with q's number and qkey: the
// peer then sends its datagrams to q with that Q_Key. q should be a UD QP
// in RTS, of the listener's device (any other is refused, the request
// left unanswered).
func (r *Request) AcceptUD(q *ib.QP, qkey uint32, privateData []byte) error {
	if !r.ud {
		return fmt.Errorf("rdmacm: AcceptUD: not a UD request (use Accept)")
	}
	if q == nil || q.Type() != ib.UD {
		return fmt.Errorf("rdmacm: AcceptUD: a UD QP is required")
	}
	if err := r.onOurDevice(q); err != nil {
		return fmt.Errorf("rdmacm: AcceptUD: %w", err)
	}
	if len(privateData) > mad.SIDRREPPrivateLen {
		return fmt.Errorf("rdmacm: AcceptUD: %d bytes of private data (a SIDR_REP carries at most %d)", len(privateData), mad.SIDRREPPrivateLen)
	}
	if err := r.answer(); err != nil {
		return err
	}
	return r.id.SIDRReply(cm.SIDRReplyParams{Status: mad.SIDRSuccess, QPN: q.Num(), QKey: qkey, PrivateData: privateData})
}
