package qp

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxed/rxed/pkg/mr"
)

// MaxPacketLen is the largest RoCE packet (UDP payload) the protocol logic
// builds: BTH and the longest header set, a 4096-byte payload, pad and
// ICRC, rounded up.
const MaxPacketLen = 4096 + 128

// Protocol constants of rdma_rxe (rxe_param.h).
const (
	// MaxUnackedPSNs is how far the requester may run ahead of the oldest
	// unacknowledged PSN (RXE_MAX_UNACKED_PSNS).
	MaxUnackedPSNs = 128
	// MaxPktPerAck is how many packets without AckReq the requester sends
	// before it asks for an ACK mid-message (RXE_MAX_PKT_PER_ACK).
	MaxPktPerAck = 64
	// DefaultPKey is the only partition key rxe has (IB_DEFAULT_PKEY_FULL).
	DefaultPKey = 0xFFFF
	// GSIQKey is the well-known Q_Key of QP1.
	GSIQKey = 0x80010000
)

// Env is the engine side of a QP: where outgoing packets are built and sent.
// The protocol logic calls it only from the goroutine that owns the QP.
type Env interface {
	// TxBuffer returns the buffer the next outgoing packet is built in, at
	// least MaxPacketLen bytes long. It stays valid until Transmit.
	TxBuffer() []byte
	// Transmit sends the first n bytes of the last TxBuffer along av (its
	// ICRC slot is filled in by the engine, which knows the UDP flow). An
	// error means the packet cannot leave at all (av names no usable
	// source GID, e.g. ErrBadAV); the requester then fails the WR with
	// LOC_QP_OP_ERR and moves the QP to ERR, as rxe does when
	// rxe_xmit_packet fails. A packet lost later on the wire is not an
	// error: RC recovers it by retransmission.
	Transmit(n int, av *AddrVector) error
}

// RecvInfo describes where a received packet came from, for the address
// check and for the GRH a UD receive completion carries.
type RecvInfo struct {
	Src, Dst netip.AddrPort
	// IPv4ID and IPv4DFClear are the IPv4 header's Identification and
	// DF flag (clear: false means DF set, what Linux and rxe send) as the
	// ICRC check solved them (wire.Flow.VerifyIPv4): a UDP socket does
	// not see the header, and a UD GRH holds it whole (grh.go).
	IPv4ID      uint16
	IPv4DFClear bool
	// TrafficClass and HopLimit are the IP header's TOS and TTL (IPv6
	// traffic class and hop limit) when the transport reported them
	// (HopLimit not 0: a received packet's TTL is at least 1), for a UD
	// GRH; else the GRH has Linux's defaults.
	TrafficClass, HopLimit uint8
	// FlowLabel is the IPv6 header's flow label (20 bits), reported with
	// them (0 over IPv4 and when not reported).
	FlowLabel uint32
}

// Config creates a QP (ibv_qp_init_attr plus what the engine supplies).
type Config struct {
	Num      uint32
	Type     Type
	Cap      Cap
	SigAll   bool // sq_sig_all: every send WR completes with a WC
	PD       *mr.PD
	Mem      *mr.Table
	SendCQ   CompletionQueue
	RecvCQ   CompletionQueue
	SRQ      ReceiveSource // nil: the QP gets its own receive queue
	Counters *Counters     // shared device counters; nil allocates private ones
	// IBATimerOnly turns off the requester's own loss recovery timer
	// (recovery.go): only IBA's local ACK timeout retransmits, as in
	// rdma_rxe. For tests that count every packet and for comparisons
	// with rxe; the congestion window and READ gap re-requests stay.
	IBATimerOnly bool
	// PortMTU is the port's active MTU, which UD uses for every message
	// (rxe get_mtu: the path MTU is for RC/UC only); 0 means MTU4096.
	PortMTU MTU
	// OnError is called (on the QP's goroutine) when the QP enters ERR by
	// itself, for the asynchronous QP-fatal event.
	OnError func(q *QP)
	// OnSQDrained is called (on the QP's goroutine) once per move into
	// SQD that asked for en_sqd_async_notify, when the last WQE started
	// before the move has completed (at once if none was outstanding),
	// for the asynchronous SQ-drained event. It must not block nor call
	// Modify.
	OnSQDrained func(q *QP)
	// OnCommEst is called (on the QP's goroutine) when a connected QP
	// takes its first request in sequence since it entered RTR, for the
	// asynchronous communication-established event (IBA 11.6.3.1,
	// IB_EVENT_COMM_EST): a passive side whose CM has not seen the RTU
	// learns from it that the peer is connected (ib_cm_notify). Once per
	// connection: a move to RESET arms it again. It must not block nor
	// call Modify.
	OnCommEst func(q *QP)
	// GIDs is the device's GID table (IPv4 unmapped), against which Modify
	// checks a connected QP's address vector as ib_modify_qp does
	// (rdma_fill_sgid_attr / rxe_av_chk_attr): the sgid_index must name an
	// entry and the destination must be of the same IP family. nil skips
	// the check, for tests of the protocol logic alone.
	GIDs []netip.Addr
}

// CompletionQueue is what the protocol logic needs from a CQ.
type CompletionQueue interface {
	// Push appends wc; an error means the completion was lost (overflow).
	Push(wc WC) error
}

// ReceiveSource hands out posted receive WRs (a QP's own RecvQueue or an
// SRQ). Pop copies the oldest WR into wr (reusing wr.SGL's capacity) and
// removes it; it reports false when none is posted.
type ReceiveSource interface {
	Pop(wr *RecvWR) bool
}

// Errors of the verbs entry points.
var (
	ErrQPState  = errors.New("qp: operation not allowed in the QP's state")
	ErrSendFull = errors.New("qp: send queue full")
	// ErrBadAV: an address vector no packet can be sent along (no
	// destination, a sgid_index outside the GID table, or source and
	// destination GIDs of different IP families).
	ErrBadAV = errors.New("qp: unusable address vector")
	// ErrDestroyed: the QP was closed (destroyed); it takes no more work.
	ErrDestroyed = errors.New("qp: QP destroyed")
)

// QP is one queue pair: its attributes, send queue and the requester,
// completer and responder state. PostSend, PostRecv, Close and Closed
// (under the posting locks), State (atomic), RecvQueueLen and
// SendQueueLen (under the queues' locks) and the getters of what never
// changes (Num, Type, Cap, PD, Counters) may be called from any
// goroutine; every other method must be called from the single goroutine
// that owns the QP (the engine's shard owner, docs/DESIGN.md).
type QP struct {
	num    uint32
	typ    Type
	cap    Cap
	sigAll bool
	pd     *mr.PD
	mem    *mr.Table
	scq    CompletionQueue
	rcq    CompletionQueue
	srq    ReceiveSource
	rq     *RecvQueue
	ctr    *Counters
	onErr  func(*QP)
	// onDrained raises the SQ-drained event (Config.OnSQDrained).
	onDrained func(*QP)
	// onCommEst raises the communication-established event
	// (Config.OnCommEst).
	onCommEst func(*QP)
	gids      []netip.Addr
	// rqPost makes PostRecv's state check and enqueue one step with
	// respect to a reset (which empties the receive queue) and to Close.
	// The send queue uses sq.mu for the same purpose.
	rqPost   sync.Mutex
	rqClosed bool // under rqPost
	// localOps executes LOCAL_INV, BIND_MW and REG_MR; nil completes them
	// with LOC_QP_OP_ERR.
	localOps LocalOps
	// remoteInv invalidates the rkey of a SEND_WITH_INV.
	remoteInv func(*QP, uint32) WCStatus

	state      atomic.Int32 // mirror of attr.State for lock-free reads
	errFlushed bool         // enterError ran (reset when leaving ERR)
	// sqDraining is rxe's attr.sq_draining: set by each move into SQD,
	// cleared once every WQE the requester had started has completed.
	sqDraining bool
	attr       Attr
	mtu        int

	sq sendQueue

	req  requester
	comp completer
	resp responder

	// deadlines; zero when not armed
	retransmitAt time.Time
	rnrAt        time.Time
	timeout      time.Duration
	rec          recovery // round trips, fast retransmit, congestion window (recovery.go)
	ibaTimerOnly bool     // Config.IBATimerOnly

	// Owned scratch, reused per packet so the data path does not allocate.
	rxWR RecvWR
}

// New creates a QP in the RESET state.
func New(c Config) (*QP, error) {
	if !c.Type.Valid() {
		return nil, fmt.Errorf("qp: invalid type %v", c.Type)
	}
	if c.Mem == nil || c.PD == nil {
		return nil, errors.New("qp: PD and memory table required")
	}
	if c.SendCQ == nil || c.RecvCQ == nil {
		return nil, errors.New("qp: send and receive CQs required")
	}
	q := &QP{
		num: c.Num, typ: c.Type, cap: c.Cap, sigAll: c.SigAll,
		pd: c.PD, mem: c.Mem, scq: c.SendCQ, rcq: c.RecvCQ, srq: c.SRQ,
		ctr: c.Counters, onErr: c.OnError, onDrained: c.OnSQDrained, onCommEst: c.OnCommEst, gids: c.GIDs,
		ibaTimerOnly: c.IBATimerOnly,
	}
	if q.ctr == nil {
		q.ctr = new(Counters)
	}
	// A queue of 0 WRs holds none, as rxe's (rxe_queue_init keeps one
	// slot of 2^k free): every post to it fails as full.
	if q.srq == nil {
		q.rq = newRecvQueue(int(c.Cap.MaxRecvWR), int(c.Cap.MaxRecvSGE))
	}
	q.sq.init(int(c.Cap.MaxSendWR), int(c.Cap.MaxSendSGE), int(c.Cap.MaxInlineData))
	q.attr.PathMTU = MTU1024
	q.mtu = 1024
	if q.typ.Datagram() {
		if c.PortMTU < MTU256 || c.PortMTU > MTU4096 {
			c.PortMTU = MTU4096
		}
		q.attr.PathMTU = c.PortMTU
		q.mtu = c.PortMTU.Bytes()
	}
	q.attr.PKeyIndex = 0
	q.attr.PortNum = 1
	if q.typ == GSI {
		q.attr.QKey = GSIQKey // fixed, see Modify
	}
	q.resetProtocol()
	return q, nil
}

// Num returns the QP number.
func (q *QP) Num() uint32 { return q.num }

// Type returns the QP type.
func (q *QP) Type() Type { return q.typ }

// State returns the current state; safe from any goroutine.
func (q *QP) State() State { return State(q.state.Load()) }

// Cap returns the QP's queue capacities.
func (q *QP) Cap() Cap { return q.cap }

// PD returns the QP's protection domain.
func (q *QP) PD() *mr.PD { return q.pd }

// Counters returns the counters the QP updates.
func (q *QP) Counters() *Counters { return q.ctr }

// Attr returns a copy of the QP's attributes (owner goroutine only).
func (q *QP) Attr() Attr {
	a := q.attr
	a.Cap = q.cap
	a.SQDraining = q.sqDraining && q.attr.State == SQD
	return a
}

// setState changes the state and its lock-free mirror.
func (q *QP) setState(s State) {
	q.attr.State = s
	q.state.Store(int32(s))
}

// resetProtocol clears the requester, completer and responder.
func (q *QP) resetProtocol() {
	q.req = requester{}
	q.comp = completer{opcode: -1}
	q.resp.reset()
	q.retransmitAt, q.rnrAt = time.Time{}, time.Time{}
	q.resetRecovery()
}

// Modify applies a validated attribute change (ibv_modify_qp). It runs on
// the owner goroutine. Moving to ERR flushes both queues.
func (q *QP) Modify(a *Attr, mask AttrMask, now time.Time) error {
	if a == nil {
		a = &Attr{} // as CheckModify reads it: every selected value zero
	}
	cur := q.attr.State
	if err := CheckModify(q.typ, cur, a, mask); err != nil {
		return err
	}
	if err := q.checkPaths(cur, a, mask); err != nil {
		return err
	}
	if err := q.checkDraining(cur, a, mask); err != nil {
		return err
	}
	if mask.Has(AttrPathMTU) && q.typ.Connected() {
		q.attr.PathMTU = a.PathMTU
		q.mtu = a.PathMTU.Bytes()
	}
	// QP1's Q_Key and P_Key index are fixed (GSIQKey, the default P_Key):
	// rxe checks and sends QP1's packets with GSI_QKEY whatever qkey the
	// consumer set, so the attributes are accepted and ignored.
	if mask.Has(AttrQKey) && q.typ != GSI {
		q.attr.QKey = a.QKey
	}
	// PSNs keep their low 24 bits, as rxe_qp_from_attr masks them with
	// BTH_PSN_MASK: a modify with a wider value succeeds.
	if mask.Has(AttrRQPSN) {
		psn := NewPSN(uint32(a.RQPSN))
		q.attr.RQPSN = psn
		q.resp.psn = psn
		q.resp.ackPSN = psn
	}
	if mask.Has(AttrSQPSN) {
		psn := NewPSN(uint32(a.SQPSN))
		q.attr.SQPSN = psn
		q.req.psn = psn
		q.req.sentEnd = psn
		q.comp.psn = psn
	}
	if mask.Has(AttrDestQPN) {
		q.attr.DestQPN = a.DestQPN
	}
	if mask.Has(AttrAccessFlags) {
		q.attr.AccessFlags = a.AccessFlags
	}
	if mask.Has(AttrAV) {
		q.attr.AV = a.AV
	}
	if mask.Has(AttrAltPath) {
		q.attr.AltAV, q.attr.AltPKeyIndex, q.attr.AltPortNum, q.attr.AltTimeout = a.AltAV, a.AltPKeyIndex, a.AltPortNum, a.AltTimeout
	}
	if mask.Has(AttrPKeyIndex) && q.typ != GSI {
		q.attr.PKeyIndex = a.PKeyIndex
	}
	if mask.Has(AttrPort) {
		q.attr.PortNum = a.PortNum
	}
	// rxe_qp_from_attr rounds both depths up to a power of two (0 stays
	// 0) and works with, and ibv_query_qp reports, the rounded value: a
	// C program that asks for 3 reads back 4 and may have 4 outstanding.
	if mask.Has(AttrMaxQPRdAtomic) {
		q.attr.MaxRdAtomic = roundUpPow2(a.MaxRdAtomic)
	}
	if mask.Has(AttrMaxDestRdAtomic) {
		q.attr.MaxDestRdAtomic = roundUpPow2(a.MaxDestRdAtomic)
		q.resp.resizeResources(int(q.attr.MaxDestRdAtomic))
	}
	if mask.Has(AttrMinRNRTimer) {
		q.attr.MinRNRTimer = a.MinRNRTimer
	}
	if mask.Has(AttrTimeout) {
		q.attr.Timeout = a.Timeout
		q.timeout = RetransmitTimeout(a.Timeout)
	}
	if mask.Has(AttrRetryCnt) {
		q.attr.RetryCnt = a.RetryCnt
		q.comp.retryCnt = a.RetryCnt
	}
	if mask.Has(AttrRNRRetry) {
		q.attr.RNRRetry = a.RNRRetry
		q.comp.rnrRetry = a.RNRRetry
	}
	if mask.Has(AttrPathMigState) {
		q.attr.PathMigState = a.PathMigState
	}
	if mask.Has(AttrEnSQDAsyncNotify) {
		q.attr.EnSQDAsyncNotify = a.EnSQDAsyncNotify
	}
	if mask.Has(AttrRateLimit) {
		q.attr.RateLimit = a.RateLimit
	}
	if mask.Has(AttrState) {
		next := a.State
		switch next {
		case Reset:
			q.errFlushed = false
			q.sqDraining = false
			q.resetProtocol()
			// Emptying the queues and entering RESET is one step for
			// PostSend and PostRecv, which check the state under the
			// same locks: a WR is either accepted before and discarded
			// here, or refused.
			q.sq.mu.Lock()
			q.rqPost.Lock()
			q.sq.clearLocked()
			if q.rq != nil {
				q.rq.Flush(nil)
			}
			q.setState(Reset)
			q.rqPost.Unlock()
			q.sq.mu.Unlock()
			q.req.idx = q.sq.head // the requester restarts at the (empty) head
		case Err:
			q.sqDraining = false
			q.setState(Err)
			q.flush()
			q.errFlushed = true
		case SQD:
			// Every move into SQD (SQD->SQD too, once drained) starts a
			// new drain, as rxe_qp_sqd does; an already drained queue
			// reports it at once.
			q.setState(SQD)
			q.sqDraining = true
			q.checkSQDrained()
		default:
			q.setState(next)
		}
	}
	return nil
}

// checkDraining refuses to change the state of a QP in SQD whose send
// queue is still draining, except to ERR, as rxe's __qp_chk_state does
// (IBA 11.2.4.2 lets the CI refuse SQD->RTS/SQD before the drain ends).
func (q *QP) checkDraining(cur State, a *Attr, mask AttrMask) error {
	if cur != SQD || !q.sqDraining || !mask.Has(AttrState) || a == nil || a.State == Err {
		return nil
	}
	return &ModifyError{Type: q.typ, From: cur, To: a.State, Attr: AttrState, Kind: ErrSQDraining}
}

// checkSQDrained ends a drain once every WQE the requester started has
// completed (rxe's req_check_sq_drain_done and comp_check_sq_drain_done:
// nothing between the consumer index and the requester's, all PSNs
// acknowledged) and raises the SQ-drained event if it was asked for.
// rxe raises the event whatever en_sqd_async_notify says; IBA 11.6.3.1
// (and the verbs' contract) makes it conditional, which is what
// applications rely on, so rxed follows IBA here.
func (q *QP) checkSQDrained() {
	if !q.sqDraining || q.attr.State != SQD || q.sq.head < q.req.startedEnd {
		return
	}
	q.sqDraining = false
	if q.attr.EnSQDAsyncNotify && q.onDrained != nil {
		q.onDrained(q)
	}
}

// MinRetransmitTimeout floors the local ACK timeout. rxe floors it at
// one jiffy (rxe_qp.c: qp_timeout_jiffies = max(1, nsecs_to_jiffies(T))),
// and the peers rxed meets (Debian 6.1 kernels, HZ 250; the rxe lab's)
// tick every 4 ms: a short timeout there waits up to 4 ms, never the
// 8 us of timeout 1. Flooring at the whole jiffy, not less, keeps rxed
// at least as patient as such a peer, so a live QP with a round trip
// over IBA's tiny T (a loaded host, a TCG guest) does not spend its
// retries on answers still on the way and fail with RETRY_EXC_ERR. Only
// timeouts 1-9 (8 us - 2.1 ms) are raised; 10 (4.19 ms) and up keep
// IBA's value.
const MinRetransmitTimeout = 4 * time.Millisecond

// RetransmitTimeout is the local ACK timeout for an attribute value:
// 4.096 us * 2^timeout, at least MinRetransmitTimeout, and 0 meaning no
// timer (IBA 9.7.6.1.3).
func RetransmitTimeout(t uint8) time.Duration {
	if t == 0 {
		return 0
	}
	if t > 31 {
		t = 31
	}
	return max(time.Duration(4096<<t)*time.Nanosecond, MinRetransmitTimeout)
}

// rnrTimerUsec is IBA table 45 (rxe's rnrnak_usec): the RNR NAK timer
// field to microseconds.
var rnrTimerUsec = [32]uint32{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960,
	1280, 1920, 2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720,
	40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
}

// RNRDelay returns the delay an RNR NAK timer field stands for.
func RNRDelay(code uint8) time.Duration {
	return time.Duration(rnrTimerUsec[code&31]) * time.Microsecond
}

// enterError moves the QP to ERR on its own (a fatal protocol error) and
// flushes the queues.
func (q *QP) enterError() {
	if q.errFlushed {
		return
	}
	q.errFlushed = true
	q.sqDraining = false // a fatal error ends a drain without the event
	q.setState(Err)
	q.flush()
	if q.onErr != nil {
		q.onErr(q)
	}
}

// flush completes every outstanding send WR and (without an SRQ) every
// posted receive WR with WR_FLUSH_ERR, as rxe does for a QP in ERR. The
// completions carry wr_id, status and qp_num only (opcode 0, byte_len 0),
// as rxe's make_send_cqe and rxe_resp.c's do_complete fill a failed one.
func (q *QP) flush() {
	q.retransmitAt, q.rnrAt, q.rec.rtoAt = time.Time{}, time.Time{}, time.Time{}
	tail := q.sq.published()
	for q.sq.head != tail {
		w := q.sq.at(q.sq.head)
		if w.state != wqeError {
			w.status = WCWRFlushErr
		}
		q.completeWQE(w, true)
	}
	q.req.idx = q.sq.head
	// A receive WR a multi-packet message had started to fill was already
	// taken off its queue: it is the oldest outstanding one, so it is
	// flushed first (rxe keeps it at the queue head until it completes).
	if q.resp.recvValid {
		q.rcq.Push(WC{ID: q.resp.recv.ID, Status: WCWRFlushErr, QPNum: q.num})
		q.resp.recvValid = false
	}
	if q.rq != nil {
		for q.rq.Pop(&q.rxWR) {
			q.rcq.Push(WC{ID: q.rxWR.ID, Status: WCWRFlushErr, QPNum: q.num})
		}
	}
}

// Deadline returns the earliest armed timer, or the zero time.
func (q *QP) Deadline() time.Time {
	d := q.retransmitAt
	if !q.rnrAt.IsZero() && (d.IsZero() || q.rnrAt.Before(d)) {
		d = q.rnrAt
	}
	if !q.rec.rtoAt.IsZero() && (d.IsZero() || q.rec.rtoAt.Before(d)) {
		d = q.rec.rtoAt
	}
	return d
}

// PostSend queues wr (ibv_post_send). It may be called from any
// goroutine; the owner must then be told to Run. In ERR the WR is queued
// and flushed by the next Run, as libibverbs providers do. The state is
// checked again under the send queue lock, so a WR is never accepted into
// a QP that a concurrent Modify has reset (or Close has destroyed).
func (q *QP) PostSend(wr *SendWR) error {
	// Checked once up front so a bad WR on a QP in the wrong state
	// reports the state, as before.
	if err := sendState(q.State()); err != nil {
		return err
	}
	if err := CheckSendWR(q.typ, q.cap, wr); err != nil {
		return err
	}
	q.sq.mu.Lock()
	defer q.sq.mu.Unlock()
	if q.sq.closed {
		return ErrDestroyed
	}
	if err := sendState(q.State()); err != nil {
		return err
	}
	return q.sq.pushLocked(wr)
}

// sendState refuses posting sends in the states before RTS.
func sendState(s State) error {
	if !s.CanPostSend() {
		return fmt.Errorf("%w: post send in %v", ErrQPState, s)
	}
	return nil
}

// PostRecv queues a receive WR on the QP's own receive queue
// (ibv_post_recv). It may be called from any goroutine. Like PostSend it
// checks the state in one step with the enqueue, so a receive is never
// left in a QP that a concurrent Modify has reset.
func (q *QP) PostRecv(wr *RecvWR) error {
	if q.rq == nil {
		return fmt.Errorf("%w: QP uses an SRQ", ErrQPState)
	}
	q.rqPost.Lock()
	defer q.rqPost.Unlock()
	if q.rqClosed {
		return ErrDestroyed
	}
	if s := q.State(); !s.CanPostRecv() {
		return fmt.Errorf("%w: post recv in %v", ErrQPState, s)
	}
	return q.rq.Post(wr)
}

// Close marks the QP destroyed: every later PostSend and PostRecv fails
// with ErrDestroyed. WRs accepted before are the destroyer's to discard.
// Unlike the other methods it may be called from any goroutine (it only
// takes the posting locks), so a destroy can shut the door on concurrent
// posts before the engine forgets the QP.
func (q *QP) Close() {
	q.sq.mu.Lock()
	q.sq.closed = true
	q.sq.mu.Unlock()
	q.rqPost.Lock()
	q.rqClosed = true
	q.rqPost.Unlock()
}

// Closed reports whether Close has run. Any goroutine may call it: a
// registration outside the worker (a multicast attach) checks it under
// its own lock, so that it cannot land after the destroy undid it.
func (q *QP) Closed() bool {
	q.sq.mu.Lock()
	defer q.sq.mu.Unlock()
	return q.sq.closed
}

// RecvQueueLen returns the number of receive WRs posted to the QP's own
// receive queue and not yet consumed (0 with an SRQ).
func (q *QP) RecvQueueLen() int {
	if q.rq == nil {
		return 0
	}
	return q.rq.Len()
}

// checkPaths validates the address vectors of a modify against the GID
// table, as ib_modify_qp does before the driver sees them
// (rdma_fill_sgid_attr, then rxe_av_chk_attr): a path no packet could
// take is refused at modify time, naming the attribute, instead of
// failing every send later.
func (q *QP) checkPaths(cur State, a *Attr, mask AttrMask) error {
	if q.gids == nil || a == nil {
		return nil
	}
	fail := func(bit AttrMask, err error) error {
		return &ModifyError{Type: q.typ, From: cur, To: NextState(cur, a, mask), Attr: bit,
			Kind: ErrAttrValue, Detail: err.Error()}
	}
	if mask.Has(AttrAV) {
		if err := CheckAVSource(&a.AV, q.gids); err != nil {
			return fail(AttrAV, err)
		}
	}
	if mask.Has(AttrAltPath) {
		if err := CheckAVSource(&a.AltAV, q.gids); err != nil {
			return fail(AttrAltPath, fmt.Errorf("alternate path: %w", err))
		}
	}
	return nil
}

// CheckAVSource reports whether packets can be sent along av from a
// device with the GID table gids (IPv4 unmapped): av must have a
// destination, its sgid_index must name a GID, and both must be of the
// same IP family (an IPv4-mapped destination counts as IPv4). The error
// wraps ErrBadAV. ibv_create_ah and modify to RTR use it.
func CheckAVSource(av *AddrVector, gids []netip.Addr) error {
	if !av.DGID.IsValid() {
		return fmt.Errorf("%w: no destination GID", ErrBadAV)
	}
	if int(av.SGIDIndex) >= len(gids) {
		return fmt.Errorf("%w: sgid_index %d is not in the GID table (%d entries)", ErrBadAV, av.SGIDIndex, len(gids))
	}
	src, dst := gids[av.SGIDIndex].Unmap(), av.DGID.Unmap()
	if src.Is4() != dst.Is4() {
		return fmt.Errorf("%w: destination GID %v and source GID %v (sgid_index %d) are of different IP families",
			ErrBadAV, av.DGID, src, av.SGIDIndex)
	}
	return nil
}
