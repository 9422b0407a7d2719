package ib

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce"
)

// PD is a protection domain (struct ibv_pd).
//
// Goroutine safety: every method may be called from any goroutine,
// concurrently with the others and with the data path.
type PD struct {
	d  *Device
	pd *mr.PD

	mu    sync.Mutex // guards the fields below; a leaf lock
	users pdUsers    // what was created in the PD, to name it when Dealloc is refused
}

// Device returns the PD's device.
func (pd *PD) Device() *Device { return pd.d }

// Dealloc frees the PD (ibv_dealloc_pd). It fails with ErrPDBusy,
// changing nothing, while regions, windows, QPs or SRQs still use it,
// and the error names them ("PD 1 in use by QP 0x2a3b4c, MR lkey
// 0x1234"). It works after Device.Close.
func (pd *PD) Dealloc() error {
	err := pd.pd.Dealloc()
	if errors.Is(err, mr.ErrPDBusy) {
		if who := pd.usersString(); who != "" {
			return errorf(ErrPDBusy, "ib: PD.Dealloc: PD %d in use by %s", pd.pd.Handle(), who)
		}
	}
	if err != nil {
		return wrap("PD.Dealloc", err)
	}
	return nil
}

// RegMR registers buf for RDMA (ibv_reg_mr). The peer addresses it at
// mr.IOVA() (the buffer's address unless WithIOVA is given) with
// mr.RKey(); local SGEs use mr.LKey(). Remote write or atomic access
// requires AccessLocalWrite, as in IBA.
func (pd *PD) RegMR(buf []byte, access Access, opts ...RegOption) (*MR, error) {
	if err := pd.d.checkOpen(); err != nil {
		return nil, err
	}
	m, err := pd.d.eng.Memory().RegMR(pd.pd, buf, access, opts...)
	if err != nil {
		return nil, wrap("RegMR", err)
	}
	pd.addMR((*MR)(m))
	return (*MR)(m), nil
}

// AllocMW allocates a memory window (ibv_alloc_mw).
func (pd *PD) AllocMW(typ MWType) (*MW, error) {
	if err := pd.d.checkOpen(); err != nil {
		return nil, err
	}
	w, err := pd.d.eng.Memory().AllocMW(pd.pd, typ)
	if err != nil {
		return nil, wrap("AllocMW", err)
	}
	pd.addMW((*MW)(w))
	return (*MW)(w), nil
}

// QPInitAttr is struct ibv_qp_init_attr.
type QPInitAttr struct {
	Type   QPType // qp_type: RC, UC, UD or GSI (QP1, see gsi.go)
	SendCQ *CQ    // send_cq: completions of send WRs
	RecvCQ *CQ    // recv_cq: completions of receive WRs
	SRQ    *SRQ   // optional shared receive queue
	Cap    QPCap  // cap: queue sizes
	// SigAll makes every send WR generate a completion (sq_sig_all).
	SigAll bool
}

// QP is a queue pair (struct ibv_qp).
//
// Goroutine safety: every method may be called from any goroutine.
// PostSend calls from several goroutines each queue their list in one
// piece, but the order between the calls is whichever came first, as
// with ibv_post_send on one QP from several threads; PostRecv likewise.
// Modify, Query and Destroy are serialised with the engine's work on the
// QP, and a post racing with Destroy is refused or discarded (Destroy).
type QP struct {
	q         *qp.QP
	pd        *PD
	init      QPInitAttr
	destroyed atomic.Bool
	eventsOff atomic.Bool // Destroy succeeded: Device.Events drops the QP's events
	events    qpEvents    // OnEvent's handlers (qpevents.go)
}

// ErrMissingCQ: CreateQP without a send or a receive CQ (rxe_qp_chk_init's
// EINVAL).
var ErrMissingCQ = errors.New("ib: QP without a send or a receive CQ")

// CreateQP creates a queue pair in the RESET state (ibv_create_qp). Its
// number is random (see pkg/roce's qpn.go), except for Type GSI: the
// device's QP1, of which there is at most one at a time (gsi.go). A
// destroyed CQ or SRQ in attr makes it fail with ErrDestroyed.
func (pd *PD) CreateQP(attr QPInitAttr) (*QP, error) {
	if err := pd.d.checkOpen(); err != nil {
		return nil, err
	}
	if attr.SendCQ == nil || attr.RecvCQ == nil {
		return nil, errorf(ErrMissingCQ, "ib: CreateQP: send and receive CQs are required")
	}
	switch attr.Type {
	case RC, UC, UD, GSI:
	default:
		return nil, errorf(ErrBadQPType, "ib: CreateQP: unsupported QP type %v", attr.Type)
	}
	if err := qp.DefaultLimits.CheckCap(attr.Cap, attr.SRQ != nil); err != nil {
		return nil, wrap("CreateQP", err)
	}
	c := qp.Config{Type: attr.Type, Cap: attr.Cap, SigAll: attr.SigAll, PD: pd.pd,
		SendCQ: cqSink{attr.SendCQ}, RecvCQ: cqSink{attr.RecvCQ}, PortMTU: pd.d.mtu,
		GIDs: pd.d.gids} // Modify refuses a path the GID table cannot send on
	if attr.SRQ != nil {
		c.SRQ = attr.SRQ.srq
	}
	// The QP's own events reach Device.Events and its handlers
	// (QP.OnEvent) through its hooks.
	x := &QP{pd: pd, init: attr}
	c.OnError = x.raiseOn(EventQPFatal)
	c.OnSQDrained = x.raiseOn(EventSQDrained)
	c.OnCommEst = x.raiseOn(EventCommEst)
	if err := holdQPResources(pd, &attr); err != nil {
		return nil, wrap("CreateQP", err)
	}
	q, err := pd.d.eng.CreateQP(c)
	if err != nil {
		releaseQPResources(pd, &attr)
		if errors.Is(err, roce.ErrClosed) {
			return nil, ErrDeviceClosed
		}
		return nil, wrap("CreateQP", err)
	}
	// Before any WR can be posted (the QP is in RESET): the verbs layer
	// executes local WRs itself, REG_MR included.
	q.SetLocalOps(verbsLocalOps{pd.d})
	x.q = q
	pd.mu.Lock()
	pd.users.addQP(x)
	pd.mu.Unlock()
	return x, nil
}

// Num returns the QP number (qp_num).
func (q *QP) Num() uint32 { return q.q.Num() }

// Type returns the QP type.
func (q *QP) Type() QPType { return q.q.Type() }

// State returns the current state without a round trip to the engine.
func (q *QP) State() QPState { return q.q.State() }

// PD returns the QP's protection domain.
func (q *QP) PD() *PD { return q.pd }

// Modify changes the QP's attributes (ibv_modify_qp). Transitions and
// masks follow IBA (pkg/qp.CheckModify); a rejected modify returns an
// error naming the offending attribute and changes nothing. An address
// vector (IBV_QP_AV, IBV_QP_ALT_PATH) whose sgid_index is not in the GID
// table, or whose destination is of the other IP family, is refused with
// ErrAttrValue, as ib_modify_qp refuses it with EINVAL. Moving to ERR
// flushes outstanding work requests with WR_FLUSH_ERR completions; moving
// to RESET discards them without completions.
//
// Moving to SQD stops the send queue: the work requests already started
// finish, the others (and those posted in SQD) wait for the move back to
// RTS. Query reports SQDraining until the started ones have completed;
// with AttrEnSQDAsyncNotify set (RTS->SQD) the device then raises
// EventSQDrained for the QP. Until then only ERR may take the QP out of
// SQD: other state changes fail with ErrSQDraining, as in rdma_rxe.
func (q *QP) Modify(attr *QPAttr, mask QPAttrMask) error {
	if q.destroyed.Load() {
		return errorf(ErrDestroyed, "ib: Modify: QP %#x destroyed", q.Num())
	}
	err := engineErr(q.pd.d.eng.ModifyQP(q.q, attr, mask))
	if err != nil && err != ErrDeviceClosed {
		return wrap("Modify", err)
	}
	return err
}

// Query returns the QP's attributes and creation attributes (ibv_query_qp).
// SQDraining is true while a QP in SQD still has started work requests
// outstanding.
func (q *QP) Query() (QPAttr, QPInitAttr, error) {
	a, err := q.pd.d.eng.QueryQP(q.q)
	return a, q.init, engineErr(err)
}

// ErrSQDraining: a QP in SQD whose send queue is still draining may move
// only to ERR (a rejected Modify is a *ModifyError matching it).
var ErrSQDraining = qp.ErrSQDraining

// PostError reports which work request of a post failed; the ones before
// it were posted.
type PostError struct {
	Index int   // index of the refused work request in the posted list
	Err   error // why it was refused
}

// Error implements error.
func (e *PostError) Error() string {
	return fmt.Sprintf("ib: work request %d: %s", e.Index, trimPkgPrefix(e.Err.Error()))
}

// Unwrap returns the cause.
func (e *PostError) Unwrap() error { return e.Err }

// PostSend posts send work requests (ibv_post_send). They are validated
// (opcode for the QP type, SGE count, inline size, atomic alignment) and
// queued in order; on error a *PostError names the first one refused and
// those before it were posted.
func (q *QP) PostSend(wrs ...SendWR) error {
	if q.destroyed.Load() {
		return &PostError{Err: ErrDestroyed}
	}
	if err := q.pd.d.checkOpen(); err != nil {
		return &PostError{Err: err}
	}
	n, err := q.pd.d.eng.PostSend(q.q, wrs)
	if err != nil {
		return &PostError{Index: n, Err: engineErr(err)}
	}
	return nil
}

// PostRecv posts receive work requests on the QP's own receive queue
// (ibv_post_recv). A QP with an SRQ receives through SRQ.PostRecv;
// posting to the QP fails with ErrQPState.
func (q *QP) PostRecv(wrs ...RecvWR) error {
	if q.destroyed.Load() {
		return &PostError{Err: ErrDestroyed}
	}
	if err := q.pd.d.checkOpen(); err != nil {
		return &PostError{Err: err}
	}
	n, err := q.pd.d.eng.PostRecv(q.q, wrs)
	if err != nil {
		return &PostError{Index: n, Err: engineErr(err)}
	}
	return nil
}

// Destroy destroys the QP (ibv_destroy_qp). Packets for it are dropped
// afterwards; no completions are generated. Its PD, CQs and SRQ are
// released, its events not yet read from Device.Events dropped; later
// operations on it fail with ErrDestroyed. A post racing
// with Destroy is either refused with ErrDestroyed or accepted before it
// and discarded with the QP. After Device.Close it only releases the
// QP's PD, CQs and SRQ (the engine that ran it has stopped), so they can
// be destroyed in turn.
func (q *QP) Destroy() error {
	if !q.destroyed.CompareAndSwap(false, true) {
		return errorf(ErrDestroyed, "ib: Destroy: QP %#x already destroyed", q.Num())
	}
	// Shut the door on posts already past the destroyed check above
	// before the engine forgets the QP.
	q.q.Close()
	// Close marks the device down before it stops the engine, so an
	// engine refusing the call as closed implies down here.
	if err := q.pd.d.eng.DestroyQP(q.q); err != nil && !q.pd.d.down.Load() {
		q.destroyed.Store(false)
		return err
	}
	// The engine has forgotten the QP: no hook of it runs any more. Its
	// events not read yet go with it (ib_uverbs_release_uevent).
	q.eventsOff.Store(true)
	q.pd.d.async.drop(q)
	releaseQPResources(q.pd, &q.init)
	q.pd.mu.Lock()
	delete(q.pd.users.qps, q)
	q.pd.mu.Unlock()
	return nil
}

// SRQInitAttr is struct ibv_srq_init_attr.
type SRQInitAttr struct {
	MaxWR  int // max_wr: requests the SRQ holds (1..MaxSRQWR)
	MaxSGE int // max_sge: SGEs per request (up to MaxSRQSGE; 0 gets 1, as in rxe)
	// Limit arms the limit event (IBV_EVENT_SRQ_LIMIT_REACHED) when fewer
	// than Limit requests remain; 0 leaves it disarmed. As in rxe it is
	// not held against MaxWR: a larger one fires with the first receive
	// taken.
	Limit int
}

// SRQ is a shared receive queue (struct ibv_srq).
//
// Goroutine safety: every method may be called from any goroutine,
// concurrently with the QPs that consume its receives.
type SRQ struct {
	srq   *qp.SRQ
	pd    *PD
	users useCount // QPs using the SRQ; Destroy refuses while any does, and retires it
}

// CreateSRQ creates a shared receive queue (ibv_create_srq).
func (pd *PD) CreateSRQ(attr SRQInitAttr) (*SRQ, error) {
	if err := pd.d.checkOpen(); err != nil {
		return nil, err
	}
	s, err := qp.NewSRQ(attr.MaxWR, attr.MaxSGE, attr.Limit)
	if err != nil {
		return nil, wrap("CreateSRQ", err)
	}
	if err := pd.pd.Hold(); err != nil {
		return nil, wrap("CreateSRQ", err)
	}
	x := &SRQ{srq: s, pd: pd}
	x.users.what = "SRQ"
	pd.mu.Lock()
	pd.users.addSRQ(x)
	pd.mu.Unlock()
	s.SetLimitHandler(func() { pd.d.post(AsyncEvent{Type: EventSRQLimitReached, SRQ: x}, x) })
	return x, nil
}

// PostRecv posts receive work requests (ibv_post_srq_recv). It fails with
// ErrDestroyed after Destroy and ErrDeviceClosed after Device.Close, as
// QP.PostRecv does (ErrDestroyed when both).
func (s *SRQ) PostRecv(wrs ...RecvWR) error {
	if err := s.usable(); err != nil {
		return &PostError{Err: err}
	}
	for i := range wrs {
		if err := s.srq.Post(&wrs[i]); err != nil {
			return &PostError{Index: i, Err: srqErr(err)}
		}
	}
	return nil
}

// ArmLimit sets srq_limit (ibv_modify_srq with IBV_SRQ_LIMIT): when a QP
// takes a receive and fewer than limit remain, EventSRQLimitReached is
// raised once and the limit reads 0 again; 0 disarms. A limit above
// max_wr fails with ErrSRQLimit (rxe_srq_chk_attr), one after Destroy
// with ErrDestroyed and one after Device.Close with ErrDeviceClosed,
// changing nothing.
func (s *SRQ) ArmLimit(limit int) error {
	if err := s.usable(); err != nil {
		return wrap("SRQ.ArmLimit", err)
	}
	if err := s.srq.ArmLimit(limit); err != nil {
		return wrap("SRQ.ArmLimit", srqErr(err))
	}
	return nil
}

// SRQAttr is struct ibv_srq_attr (SRQ.Query, SRQ.Modify).
type SRQAttr = qp.SRQAttr

// SRQAttrMask is enum ibv_srq_attr_mask.
type SRQAttrMask = qp.SRQAttrMask

// SRQ attribute bits of SRQ.Modify.
const (
	SRQMaxWR = qp.SRQMaxWR // IBV_SRQ_MAX_WR: resize
	SRQLimit = qp.SRQLimit // IBV_SRQ_LIMIT: arm the limit event (as ArmLimit)
)

// Modify resizes the SRQ (SRQMaxWR) and/or sets srq_limit (SRQLimit),
// like ibv_modify_srq on rdma_rxe (rxe_srq_chk_attr, rxe_queue_resize),
// all or nothing: a refusal changes nothing. A resize keeps the queued
// receives in order for the QPs; it fails with ErrSRQSize when max_wr is
// outside 1..MaxSRQWR, below the limit armed before the call or below
// the receives queued. A limit above the max_wr before the call's
// resize, or below 0, fails with ErrSRQLimit. Other mask bits are
// ignored, as rxe ignores them; nil attr reads as zero values. After
// Destroy it fails with ErrDestroyed, after Device.Close with
// ErrDeviceClosed.
//
// Posts (PostRecv) and the QPs' takes may run meanwhile: the resize is
// one step between them (pkg/qp SRQ.Modify), so no receive is lost,
// repeated or reordered; a post that found the old queue full failed
// with ErrRecvFull.
func (s *SRQ) Modify(attr *SRQAttr, mask SRQAttrMask) error {
	if err := s.usable(); err != nil {
		return wrap("SRQ.Modify", err)
	}
	var a SRQAttr
	if attr != nil {
		a = *attr
	}
	if err := s.srq.Modify(a, mask); err != nil {
		return wrap("SRQ.Modify", srqErr(err))
	}
	return nil
}

// Query returns max_wr, max_sge and srq_limit (ibv_query_srq): the sizes
// exactly as created or resized (rxe reports the 2^k - 1 it rounded
// them up to), a max_sge of 0 read as the 1 it got, srq_limit 0 when
// disarmed or fired. After Destroy it fails with ErrDestroyed, after
// Device.Close with ErrDeviceClosed (as QP.Query).
func (s *SRQ) Query() (SRQAttr, error) {
	if err := s.usable(); err != nil {
		return SRQAttr{}, wrap("SRQ.Query", err)
	}
	a, err := s.srq.Query()
	if err != nil {
		return SRQAttr{}, wrap("SRQ.Query", srqErr(err))
	}
	return a, nil
}

// usable fails as the QP verbs do on a QP: ErrDestroyed after Destroy,
// then ErrDeviceClosed after Device.Close. The SRQ itself is pkg/qp's
// and would still work, but the device it belongs to is gone: its QPs
// take no more receives, and a program must not be told otherwise.
func (s *SRQ) usable() error {
	if s.users.retired() {
		return errorf(ErrDestroyed, "ib: SRQ destroyed")
	}
	return s.pd.d.checkOpen()
}

// srqErr gives qp's "receive queue destroyed" of a destroyed SRQ this
// package's ErrDestroyed.
func srqErr(err error) error {
	if errors.Is(err, qp.ErrQueueClosed) {
		return errorf(ErrDestroyed, "ib: SRQ destroyed")
	}
	return err
}

// Limit returns the armed limit (ibv_query_srq).
func (s *SRQ) Limit() int { return s.srq.Limit() }

// Len returns the number of posted, unconsumed receive requests.
func (s *SRQ) Len() int { return s.srq.Len() }

// Destroy destroys the SRQ (ibv_destroy_srq). It fails with ErrBusy,
// changing nothing, while QPs use the SRQ. Its EventSRQLimitReached not
// yet read from Device.Events is dropped.
func (s *SRQ) Destroy() error {
	first, err := s.users.retire()
	if err != nil {
		return err
	}
	if !first {
		return errorf(ErrDestroyed, "ib: Destroy: SRQ already destroyed")
	}
	// retire above made eventsGone true: no limit event of it is queued
	// now.
	s.pd.d.async.drop(s)
	s.pd.pd.Unhold()
	s.srq.Close()
	s.pd.mu.Lock()
	delete(s.pd.users.srqs, s)
	s.pd.mu.Unlock()
	return nil
}

// AHAttr is struct ibv_ah_attr (the address vector).
type AHAttr = AddrVector

// AH is an address handle for UD (struct ibv_ah). It is immutable: any
// goroutine may use it at any time.
type AH struct {
	av AddrVector
}

// ErrBadAV: an address vector no packet can be sent along (no
// destination, a sgid_index outside the GID table, or source and
// destination of different IP families). CreateAH refuses it; a UD send
// whose hand-built AV is such completes with LOC_QP_OP_ERR and moves the
// QP to ERR, as rdma_rxe does when it cannot send a request.
var ErrBadAV = qp.ErrBadAV

// CreateAH creates an address handle (ibv_create_ah). As rxe_av_chk_attr
// (after ib_create_ah's GID lookup) it refuses, with ErrBadAV, an
// sgid_index that is not in the GID table; and a destination of the other
// IP family than the source GID, which no packet could be sent to.
func (pd *PD) CreateAH(attr AHAttr) (*AH, error) {
	if err := pd.d.checkOpen(); err != nil {
		return nil, err
	}
	if err := qp.CheckAVSource(&attr, pd.d.gids); err != nil {
		return nil, wrap("CreateAH", err)
	}
	return &AH{av: attr}, nil
}

// AV returns the address vector to put in SendWR.AV for a UD send.
func (ah *AH) AV() AddrVector { return ah.av }

// Destroy destroys the address handle (ibv_destroy_ah).
func (ah *AH) Destroy() error { return nil }

// UDSend fills the UD addressing fields of wr from ah, the remote QPN and
// Q_Key, like the ud part of struct ibv_send_wr.
func UDSend(wr *SendWR, ah *AH, remoteQPN, remoteQKey uint32) {
	wr.AV = ah.av
	wr.RemoteQPN = remoteQPN
	wr.RemoteQKey = remoteQKey
}
