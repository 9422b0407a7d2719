package ib

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxed/rxed/pkg/qp"

	"github.com/rxed/rxed/pkg/wire"
)

// MADLen is the size of a management datagram (IBA 13.4.2): the payload
// of every packet QP1 sends and receives.
const MADLen = 256

// grhLen is the room a UD receive buffer keeps for the GRH.
const grhLen = 40

// MAD agent defaults: queue depths as ib_mad's (mad_recvq_size and
// mad_sendq_size are 512 and 128 in the kernel; a CM over one port
// needs far fewer).
const (
	DefaultMADRecvDepth = 128
	DefaultMADSendDepth = 64
)

// madCloseSettle bounds how long Close waits for the MADs already posted
// to leave before it destroys QP1. A UD send completes as soon as its
// packet is handed to the transport, so the wait is a worker's round at
// most; the bound is for a transport that stopped taking datagrams.
const madCloseSettle = time.Second

// MADHandler receives one MAD that arrived on QP1: src is the peer's
// address (its GID), dst the local one it was sent to, both from the
// GRH, as IP addresses (IPv4 in its 4-byte form). mad is the handler's
// to keep.
type MADHandler func(src, dst netip.Addr, mad []byte)

// MADTrafficHandler is a MADHandler that also gets the IP traffic class
// the MAD arrived with, as its GRH holds it (rxe copies the received
// header into a GSI receive's GRH): the IPv6 traffic class, or the IPv4
// TOS. The kernel's CM answers some MADs on an address handle built
// from that GRH (ib_init_ah_attr_from_wc), whose traffic class is the
// GRH's version_tclass_flow: the IPv6 one, but 0 over IPv4, where rxe's
// GRH starts with 20 zero bytes; which applies is the handler's to say
// (cm.Manager.HandleMADTraffic). It is 0 while the device's transport
// does not report received traffic (a Config.Wrap that does not pass
// transport.TrafficReporter on).
type MADTrafficHandler func(src, dst netip.Addr, trafficClass uint8, mad []byte)

// MADAgentConfig configures OpenMADAgent.
type MADAgentConfig struct {
	// Handler is called for every MAD received, from one goroutine of
	// the agent, in arrival order; required. It may call Send (the reply
	// to a request is usually sent from here). While it runs no other
	// MAD is delivered, but the receive queue stays filled: the agent
	// reposts a buffer before it hands the buffer's MAD to the handler.
	Handler MADHandler
	// TrafficHandler, set instead of Handler, is called as Handler
	// would be, with the received traffic class too.
	TrafficHandler MADTrafficHandler
	// RecvDepth is the number of receive buffers kept posted; 0 means
	// DefaultMADRecvDepth. MADs arriving while none is posted are lost
	// (UD), as with the kernel's MAD layer.
	RecvDepth int
	// SendDepth is the number of sends in flight; 0 means
	// DefaultMADSendDepth. Send waits for a free buffer beyond that.
	SendDepth int
	// Logger receives debug logs; nil is silent.
	Logger *slog.Logger
}

// MADAgentStats counts what a MADAgent did.
type MADAgentStats struct {
	Sent       uint64 // MADs posted to the send queue
	SendErrors uint64 // send completions that failed
	Received   uint64 // MADs handed to the handler
	RecvErrors uint64 // receive completions that failed (e.g. LOC_LEN_ERR: a packet longer than a MAD)
	BadGRH     uint64 // receives whose GRH named no IPv4/IPv6 addresses (not delivered)
	Recoveries uint64 // times QP1 was found in ERR and brought back to RTS
}

// ErrMADAgentClosed is returned by Send on a closed agent.
var ErrMADAgentClosed = errors.New("ib: MAD agent closed")

// MADAgent sends and receives MADs on a device's QP1, for a connection
// manager (pkg/cm) or any other general service.
//
// It owns the GSI QP and its own PD, CQs and registered buffers: a
// receive buffer of 40+256 bytes per RecvDepth, one of 256 bytes per
// SendDepth. A goroutine of its own waits for receive completions,
// reposts each buffer and calls the handler; sends go out from the
// calling goroutine and their buffers are recycled as their completions
// arrive. Should QP1 enter ERR (rxe moves a UD QP there when a send
// cannot leave at all), the agent resets it to RTS and reposts its
// receives.
//
// Send, Stats and QP are safe for concurrent use, also from the handler;
// Close may be called from any goroutine except the handler (it waits
// for the handler to return), more than once.
type MADAgent struct {
	dev       *Device
	handler   MADTrafficHandler
	log       *slog.Logger
	recvDepth int
	sendDepth int

	// Set by OpenMADAgent, released by Close.
	pd       *PD
	scq, rcq *CQ
	qp       *QP
	mem      []byte // receive buffers, then send buffers
	mr       *MR

	ctx    context.Context // done when Close begins
	cancel context.CancelFunc
	done   chan struct{} // closed when the receive goroutine returns

	// sendMu serialises Send, recovery and Close's teardown; it guards
	// free and closed.
	sendMu sync.Mutex
	free   []int // indices of send buffers not in flight
	closed bool

	closeOnce sync.Once
	closeErr  error
	// settleFor bounds Close's wait for the sends in flight
	// (madCloseSettle); testSettleWait, nil in production, is called
	// before each of its waits.
	settleFor      time.Duration
	testSettleWait func()

	sent, sendErrs, received, recvErrs, badGRH, recoveries atomic.Uint64
}

// OpenMADAgent creates dev's GSI QP (QP1), brings it to RTS with its
// receive queue filled, and starts delivering MADs to cfg.Handler. It
// fails if the device already has a GSI QP (ErrQPNInUse).
func OpenMADAgent(dev *Device, cfg MADAgentConfig) (*MADAgent, error) {
	handler := cfg.TrafficHandler
	switch {
	case handler != nil && cfg.Handler != nil:
		return nil, errors.New("ib: OpenMADAgent: Handler and TrafficHandler are exclusive")
	case handler == nil && cfg.Handler == nil:
		return nil, errors.New("ib: OpenMADAgent: a handler is required")
	case handler == nil:
		h := cfg.Handler
		handler = func(src, dst netip.Addr, _ uint8, mad []byte) { h(src, dst, mad) }
	}
	a := &MADAgent{dev: dev, handler: handler, log: cfg.Logger,
		recvDepth: cfg.RecvDepth, sendDepth: cfg.SendDepth, settleFor: madCloseSettle, done: make(chan struct{})}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.recvDepth <= 0 {
		a.recvDepth = DefaultMADRecvDepth
	}
	if a.sendDepth <= 0 {
		a.sendDepth = DefaultMADSendDepth
	}
	if err := a.open(); err != nil {
		a.release()
		return nil, fmt.Errorf("ib: OpenMADAgent: %w", err)
	}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	go a.receiveLoop()
	return a, nil
}

// open allocates the agent's resources and brings QP1 up.
func (a *MADAgent) open() error {
	var err error
	if a.pd, err = a.dev.AllocPD(); err != nil {
		return err
	}
	if a.rcq, err = a.dev.CreateCQ(a.recvDepth); err != nil {
		return err
	}
	if a.scq, err = a.dev.CreateCQ(a.sendDepth); err != nil {
		return err
	}
	a.mem = make([]byte, a.recvDepth*(grhLen+MADLen)+a.sendDepth*MADLen)
	if a.mr, err = a.pd.RegMR(a.mem, AccessLocalWrite); err != nil {
		return err
	}
	a.qp, err = a.pd.CreateQP(QPInitAttr{Type: GSI, SendCQ: a.scq, RecvCQ: a.rcq,
		Cap: QPCap{MaxSendWR: uint32(a.sendDepth), MaxRecvWR: uint32(a.recvDepth), MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return err
	}
	return a.start()
}

// start moves QP1 from RESET to RTS, posts every receive buffer and
// marks every send buffer free. Called before the receive goroutine
// runs, or under sendMu.
func (a *MADAgent) start() error {
	if err := a.qp.Modify(&QPAttr{State: QPSInit, QKey: GSIQKey}, AttrState|AttrPKeyIndex|AttrQKey); err != nil {
		return err
	}
	if err := a.qp.Modify(&QPAttr{State: QPSRTR}, AttrState); err != nil {
		return err
	}
	if err := a.qp.Modify(&QPAttr{State: QPSRTS}, AttrState|AttrSQPSN); err != nil {
		return err
	}
	wrs := make([]RecvWR, a.recvDepth)
	for i := range wrs {
		wrs[i] = a.recvWR(i)
	}
	if err := a.qp.PostRecv(wrs...); err != nil {
		return err
	}
	a.free = a.free[:0]
	for i := range a.sendDepth {
		a.free = append(a.free, i)
	}
	return nil
}

// recvWR is the receive request for buffer i.
func (a *MADAgent) recvWR(i int) RecvWR {
	off := i * (grhLen + MADLen)
	return RecvWR{ID: uint64(i), SGL: []SGE{{Addr: a.mr.IOVA() + uint64(off), Length: grhLen + MADLen, LKey: a.mr.LKey()}}}
}

// recvBuf is receive buffer i.
func (a *MADAgent) recvBuf(i int) []byte {
	off := i * (grhLen + MADLen)
	return a.mem[off : off+grhLen+MADLen]
}

// sendOff is the offset of send buffer i in mem.
func (a *MADAgent) sendOff(i int) int { return a.recvDepth*(grhLen+MADLen) + i*MADLen }

// QP returns the agent's GSI QP (for Query and counters; posting to it
// directly would take buffers from under the agent).
func (a *MADAgent) QP() *QP { return a.qp }

// Stats returns the agent's counters.
func (a *MADAgent) Stats() MADAgentStats {
	return MADAgentStats{Sent: a.sent.Load(), SendErrors: a.sendErrs.Load(), Received: a.received.Load(),
		RecvErrors: a.recvErrs.Load(), BadGRH: a.badGRH.Load(), Recoveries: a.recoveries.Load()}
}

// Send sends mad (exactly MADLen bytes) from QP1 at src, one of the
// device's GIDs, to QP1 at dst, the peer's GID (IPv4 addresses in either
// form), with Q_Key GSIQKey. It returns once the MAD is queued (mad may
// then be reused), waiting for a free send buffer if SendDepth sends are
// in flight. Delivery is not confirmed: the service above retries, as
// the CM does. An unusable address pair (src not in the GID table, dst
// invalid or of the other IP family) fails with ErrBadAV without
// touching the QP.
func (a *MADAgent) Send(src, dst netip.Addr, mad []byte) error {
	return a.send(context.Background(), src, dst, 0, 0, mad)
}

// SendContext is Send that gives up waiting for a send buffer when ctx
// is done.
func (a *MADAgent) SendContext(ctx context.Context, src, dst netip.Addr, mad []byte) error {
	return a.send(ctx, src, dst, 0, 0, mad)
}

// SendTraffic is Send on an address handle whose GRH has trafficClass
// and hopLimit (0: 64), which the MAD then carries as its IP TOS and TTL
// (IPv6 traffic class and hop limit), as rxe puts an AH's GRH in the IP
// header: the CM sends a connection's MADs on its path's AH (cm.c's
// cm_alloc_msg), whose traffic class rdma_cm makes the ID's TOS.
func (a *MADAgent) SendTraffic(src, dst netip.Addr, trafficClass, hopLimit uint8, mad []byte) error {
	return a.send(context.Background(), src, dst, trafficClass, hopLimit, mad)
}

func (a *MADAgent) send(ctx context.Context, src, dst netip.Addr, trafficClass, hopLimit uint8, mad []byte) error {
	if len(mad) != MADLen {
		return fmt.Errorf("ib: MADAgent.Send: a MAD is %d bytes, not %d", MADLen, len(mad))
	}
	idx := a.dev.GIDIndex(src)
	if idx < 0 {
		return fmt.Errorf("ib: MADAgent.Send: %w: %v is not in the GID table", ErrBadAV, src)
	}
	av := AddrVector{DGID: dst.Unmap(), SGIDIndex: uint8(idx), PortNum: 1, DestPort: a.dev.UDPPort(),
		TrafficClass: trafficClass, HopLimit: hopLimit}
	if err := qp.CheckAVSource(&av, a.dev.gids); err != nil {
		return fmt.Errorf("ib: MADAgent.Send: %w", err)
	}
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	slot, err := a.takeSendBuf(ctx)
	if err != nil {
		return err
	}
	off := a.sendOff(slot)
	copy(a.mem[off:off+MADLen], mad)
	wr := SendWR{ID: uint64(slot), Opcode: WRSend, Flags: SendSignaled,
		SGL: []SGE{{Addr: a.mr.IOVA() + uint64(off), Length: MADLen, LKey: a.mr.LKey()}},
		AV:  av, RemoteQPN: GSIQPN, RemoteQKey: GSIQKey}
	if err := a.qp.PostSend(wr); err != nil {
		a.free = append(a.free, slot)
		if a.closed || errors.Is(err, ErrDestroyed) {
			return ErrMADAgentClosed
		}
		return fmt.Errorf("ib: MADAgent.Send: %w", err)
	}
	a.sent.Add(1)
	return nil
}

// takeSendBuf returns a free send buffer, reaping send completions and
// waiting for one if none is free. Under sendMu.
func (a *MADAgent) takeSendBuf(ctx context.Context) (int, error) {
	var wcs [16]WC
	for {
		if a.closed {
			return 0, ErrMADAgentClosed
		}
		a.reapSends(wcs[:])
		if n := len(a.free); n > 0 {
			slot := a.free[n-1]
			a.free = a.free[:n-1]
			return slot, nil
		}
		// Every buffer is in flight, and UD completes each send as soon
		// as it leaves (or flushes it): the wait is short. Close cancels
		// a.ctx to end it.
		err := a.waitSendCQ(ctx)
		if err != nil {
			if a.ctx.Err() != nil {
				return 0, ErrMADAgentClosed
			}
			return 0, fmt.Errorf("ib: MADAgent.Send: %w", err)
		}
	}
}

// waitSendCQ waits for a send completion, ctx's end or Close.
func (a *MADAgent) waitSendCQ(ctx context.Context) error {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	unhook := context.AfterFunc(a.ctx, stop)
	defer unhook()
	return a.scq.Wait(wctx)
}

// reapSends takes send completions off the send CQ and frees their
// buffers. Under sendMu.
func (a *MADAgent) reapSends(wcs []WC) {
	for {
		n := a.scq.c.Poll(wcs)
		for _, wc := range wcs[:n] {
			if wc.Status != qp.WCSuccess && wc.Status != qp.WCWRFlushErr {
				a.sendErrs.Add(1)
				a.log.Debug("ib: MAD send failed", "status", wc.Status.String())
			}
			a.free = append(a.free, int(wc.ID))
		}
		if n < len(wcs) {
			return
		}
	}
}

// receiveLoop delivers received MADs until Close.
func (a *MADAgent) receiveLoop() {
	defer close(a.done)
	wcs := make([]WC, 32)
	for {
		n, err := a.rcq.waitPoll(a.ctx, wcs, false)
		if err != nil {
			return // Close
		}
		for i := range wcs[:n] {
			if !a.received1(&wcs[i]) {
				if a.ctx.Err() != nil {
					return
				}
				a.recover()
				break // what is left in the batch was flushed with the QP
			}
		}
	}
}

// received1 handles one receive completion: it reposts the buffer and
// delivers the MAD. It returns false when the completion says QP1 is in
// ERR (a flushed receive), for recovery.
func (a *MADAgent) received1(wc *WC) bool {
	if wc.Status == qp.WCWRFlushErr {
		return false
	}
	i := int(wc.ID)
	var mad []byte
	var src, dst netip.Addr
	var class uint8
	good := wc.Status == qp.WCSuccess && wc.ByteLen >= grhLen
	ok := false
	if good {
		buf := a.recvBuf(i)
		if src, dst, ok = grhAddrs(buf[:grhLen]); ok {
			class = grhTrafficClass(buf[:grhLen])
			mad = append([]byte(nil), buf[grhLen:wc.ByteLen]...)
		}
	}
	// Back in the queue before the handler runs (and before the
	// counters say the MAD was seen): a slow handler does not empty the
	// receive queue under a burst.
	if err := a.qp.PostRecv(a.recvWR(i)); err != nil {
		// QP1 went to ERR (the flush follows and recovery reposts
		// everything) or the agent is closing.
		a.log.Debug("ib: MAD receive repost failed", "err", err)
	}
	switch {
	case !good:
		a.recvErrs.Add(1)
		a.log.Debug("ib: MAD receive failed", "status", wc.Status.String(), "len", wc.ByteLen)
	case !ok:
		a.badGRH.Add(1)
	default:
		a.received.Add(1)
		a.handler(src, dst, class, mad)
	}
	return true
}

// recover brings QP1 back from ERR: RESET discards what is queued, the
// CQs are emptied of the flushed completions, and start reposts every
// receive and frees every send buffer. Senders wait meanwhile.
func (a *MADAgent) recover() {
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	if a.closed {
		return
	}
	a.log.Debug("ib: MAD agent: QP1 in ERR, restarting it")
	if err := a.qp.Modify(&QPAttr{State: QPSReset}, AttrState); err != nil {
		a.log.Error("ib: MAD agent: reset of QP1 failed", "err", err)
		return
	}
	var wcs [32]WC
	for a.scq.c.Poll(wcs[:]) > 0 {
	}
	for a.rcq.c.Poll(wcs[:]) > 0 {
	}
	if err := a.start(); err != nil {
		a.log.Error("ib: MAD agent: restart of QP1 failed", "err", err)
		return
	}
	a.recoveries.Add(1) // QP1 is in RTS with every receive posted
}

// Close stops delivery (waiting for a running handler to return), waits
// for the MADs already sent to leave, destroys QP1 and releases the
// agent's resources. Sends waiting for a buffer, and later ones, fail
// with ErrMADAgentClosed.
//
// The wait is what makes "Send returned" mean "the MAD goes out" up to
// Close, as in the kernel, whose ULP's post runs rxe's requester inline,
// so that the MAD is built during the post. Here a post that finds QP1's
// shard owned (the worker handing over a received MAD, say) only records
// a kick for the owner to run, and DestroyQP's forget may reach the
// owner before that kick does: the MAD then went with the QP, as
// QP.Destroy discards what is posted before it (a device's rdma_cm
// closing its connections lost their DREQs that way). It is bounded
// (madCloseSettle) and skipped once the device is down, whose engine
// sends nothing more.
func (a *MADAgent) Close() error {
	a.closeOnce.Do(func() {
		a.cancel()
		<-a.done
		a.sendMu.Lock()
		a.closed = true
		a.settleSends()
		a.sendMu.Unlock()
		a.closeErr = a.release()
	})
	return a.closeErr
}

// settleSends waits until every send buffer is back, their completions
// reaped, or for settleFor at most. Under sendMu, with closed set: no
// send can start meanwhile (a sender waiting for sendMu then fails with
// ErrMADAgentClosed), and none waits for a buffer (Close's cancel ended
// that wait before sendMu was taken).
func (a *MADAgent) settleSends() {
	var wcs [16]WC
	a.reapSends(wcs[:])
	if len(a.free) == a.sendDepth {
		return // the usual case: nothing in flight, no timer
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.settleFor)
	defer cancel()
	for len(a.free) < a.sendDepth {
		if a.dev.down.Load() {
			return // the engine has stopped: nothing more completes
		}
		if a.testSettleWait != nil {
			a.testSettleWait()
		}
		if err := a.scq.Wait(ctx); err != nil {
			a.log.Debug("ib: MAD agent: closing with sends in flight",
				"in_flight", a.sendDepth-len(a.free), "err", err)
			return
		}
		a.reapSends(wcs[:])
	}
}

// release frees whatever open allocated, in reverse order.
func (a *MADAgent) release() error {
	var errs []error
	if a.qp != nil {
		errs = append(errs, a.qp.Destroy())
	}
	if a.mr != nil {
		errs = append(errs, a.mr.Dereg())
	}
	for _, cq := range []*CQ{a.scq, a.rcq} {
		if cq != nil {
			errs = append(errs, cq.Destroy())
		}
	}
	if a.pd != nil {
		errs = append(errs, a.pd.Dealloc())
	}
	return errors.Join(errs...)
}

// grhAddrs reads the source and destination addresses out of the 40
// bytes a UD receive puts before the payload: an IPv6 header, or for
// IPv4 20 zero bytes and the IPv4 header (rxe's layout).
func grhAddrs(grh []byte) (src, dst netip.Addr, ok bool) {
	switch {
	case grh[0]>>4 == 6:
		src = netip.AddrFrom16([16]byte(grh[8:24])).Unmap()
		dst = netip.AddrFrom16([16]byte(grh[24:40])).Unmap()
		return src, dst, true
	case grh[20]>>4 == 4:
		src = netip.AddrFrom4([4]byte(grh[32:36]))
		dst = netip.AddrFrom4([4]byte(grh[36:40]))
		return src, dst, true
	}
	return netip.Addr{}, netip.Addr{}, false
}

// grhTrafficClass reads the received IP traffic class out of a GRH of a
// layout grhAddrs accepted: the IPv6 header's, or the IPv4 header's TOS
// after the 20 zero bytes (wire.IPTrafficClass).
func grhTrafficClass(grh []byte) uint8 {
	if grh[0]>>4 == 6 {
		return wire.IPTrafficClass(grh)
	}
	return wire.IPTrafficClass(grh[20:])
}
