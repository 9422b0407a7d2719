package allreduce

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
)

// Ring is one rank of a connected ring. Data is the vector AllReduce sums
// in place (registered memory over RDMA). Not safe for concurrent use.
type Ring struct {
	ring
	closeOnce sync.Once
	closeFn   func() error
}

// Data is the rank's vector.
func (r *Ring) Data() []float32 { return r.data }

// AllReduce sums every rank's Data in place; on error the ring is closed
// (the neighbours learn it) and must not be used again.
func (r *Ring) AllReduce(ctx context.Context) error {
	if err := r.allReduce(ctx); err != nil {
		r.Close()
		return err
	}
	return nil
}

// Close leaves the ring, disconnecting both neighbours.
func (r *Ring) Close() error {
	var err error
	r.closeOnce.Do(func() { err = r.closeFn() })
	return err
}

const (
	nSlots    = 2 // receive slots per rank: one step of pipelining
	recvDepth = 2 * nSlots
)

// rdmaLink moves chunks by RDMA WRITE with immediate into the next rank's
// slots; credits come back as zero-length SENDs.
type rdmaLink struct {
	cfg            Config
	pd             *ib.PD
	cq             *ib.CQ
	qpNext, qpPrev *ib.QP
	cNext, cPrev   *rdmacm.Conn
	l              *rdmacm.Listener
	slots          []byte
	slotsMR        *ib.MR
	dataMR         *ib.MR
	remote         hello // the next rank's slots

	credits  int             // slots of the next rank we may write
	arrived  map[uint32]bool // steps whose chunk is in our slot
	inFlight int             // WRITEs not completed
	wcs      []ib.WC
}

// RDMAConfig says where a rank listens and where its next rank is.
type RDMAConfig struct {
	Listen netip.AddrPort // our rdma_cm address
	Next   netip.AddrPort // the next rank's
}

// DialRDMA joins the ring on dev: listens for the previous rank, dials the
// next (retrying until Timeout while it is not up yet), and checks that
// both agree on the ring.
func DialRDMA(ctx context.Context, dev *ib.Device, cfg Config, rc RDMAConfig) (*Ring, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	l := &rdmaLink{cfg: cfg, arrived: map[uint32]bool{}, credits: nSlots, wcs: make([]ib.WC, 16)}
	r := &Ring{ring: ring{cfg: cfg, l: l, data: make([]float32, cfg.Count)}}
	r.closeFn = l.close
	if err := l.setup(ctx, dev, r.data, rc); err != nil {
		l.close()
		return nil, err
	}
	done := make(chan struct{})
	var once sync.Once
	var why error
	watch := func(c *rdmacm.Conn, rank int) {
		<-c.Done()
		once.Do(func() { why = fmt.Errorf("rank %d left the ring (%v)", rank, c.Err()); close(done) })
	}
	go watch(l.cNext, cfg.next())
	go watch(l.cPrev, cfg.prev())
	r.done, r.doneE = done, func() error { return why }
	return r, nil
}

func (l *rdmaLink) setup(ctx context.Context, dev *ib.Device, data []float32, rc RDMAConfig) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	// Answer REQs (with a REJ until we listen) from now on, so an early
	// neighbour retries at once instead of waiting for a CM timeout.
	if err := rdmacm.Enable(dev, nil); err != nil {
		return err
	}
	var err error
	if l.pd, err = dev.AllocPD(); err != nil {
		return err
	}
	if l.cq, err = dev.CreateCQ(64); err != nil {
		return err
	}
	l.slots = make([]byte, nSlots*maxChunk(l.cfg.Count, l.cfg.Ranks)*4)
	if l.slotsMR, err = l.pd.RegMR(l.slots, ib.AccessLocalWrite|ib.AccessRemoteWrite); err != nil {
		return err
	}
	if l.dataMR, err = l.pd.RegMR(f32bytes(data), ib.AccessLocalWrite); err != nil {
		return err
	}
	mk := func() (*ib.QP, error) {
		q, err := l.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: l.cq, RecvCQ: l.cq,
			Cap: ib.QPCap{MaxSendWR: 8, MaxRecvWR: recvDepth, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			return nil, err
		}
		if err := ib.InitQP(q, ib.ConnectAttr{}); err != nil {
			return q, err
		}
		for range recvDepth {
			if err := q.PostRecv(ib.RecvWR{}); err != nil {
				return q, err
			}
		}
		return q, nil
	}
	if l.qpNext, err = mk(); err != nil {
		return err
	}
	if l.qpPrev, err = mk(); err != nil {
		return err
	}
	if l.l, err = rdmacm.Listen(dev, rc.Listen, nil); err != nil {
		return fmt.Errorf("allreduce: rank %d listening on %v: %w", l.cfg.Rank, rc.Listen, err)
	}
	accepted := make(chan error, 1)
	go func() {
		err := l.acceptPrev(ctx)
		if errors.Is(err, errMismatch) {
			cancel() // no point waiting for the next rank
		}
		accepted <- err
	}()
	dialErr := l.dialNext(ctx, rc.Next)
	if dialErr != nil {
		cancel()
	}
	accErr := <-accepted
	_ = l.l.Close()
	l.l = nil
	return firstCause(dialErr, accErr)
}

func (l *rdmaLink) acceptPrev(ctx context.Context) error {
	mine := hello{rank: l.cfg.Rank, ranks: l.cfg.Ranks, count: l.cfg.Count,
		slotAddr: l.slotsMR.IOVA(), slotRKey: l.slotsMR.RKey(), slotSize: uint32(len(l.slots) / nSlots)}
	for {
		req, err := l.l.Accept(ctx)
		if err != nil {
			return fmt.Errorf("allreduce: rank %d: no connection from rank %d within %v: %w", l.cfg.Rank, l.cfg.prev(), l.cfg.Timeout, err)
		}
		h, err := parseHello(req.PrivateData)
		if err == nil {
			err = l.cfg.agree(h, l.cfg.prev())
		}
		if err != nil {
			msg := err.Error()
			_ = req.Reject([]byte(msg[:min(len(msg), 148)]))
			if errors.Is(err, errNotRing) {
				continue
			}
			return fmt.Errorf("allreduce: %w", err)
		}
		c, err := req.Accept(ctx, l.qpPrev, &rdmacm.ConnParam{PrivateData: mine.append(nil), RNRRetryCount: 7})
		if err != nil {
			return fmt.Errorf("allreduce: rank %d accepting rank %d: %w", l.cfg.Rank, h.rank, err)
		}
		l.cPrev = c
		return nil
	}
}

func (l *rdmaLink) dialNext(ctx context.Context, next netip.AddrPort) error {
	mine := hello{rank: l.cfg.Rank, ranks: l.cfg.Ranks, count: l.cfg.Count}
	for {
		c, err := rdmacm.Dial(ctx, l.qpNext, next, &rdmacm.ConnParam{PrivateData: mine.append(nil),
			RetryCount: 7, RNRRetryCount: 7, ACKTimeout: 14, Timeout: time.Second})
		var rej *rdmacm.RejectError
		switch {
		case err == nil:
			h, err := parseHello(c.PrivateData())
			if err == nil {
				err = l.cfg.agree(h, l.cfg.next())
			}
			if err != nil {
				_ = c.Disconnect(context.Background())
				return fmt.Errorf("allreduce: %w", err)
			}
			l.cNext, l.remote = c, h
			return nil
		case errors.As(err, &rej) && len(rej.PrivateData) > 0 && rej.PrivateData[0] != 0:
			return fmt.Errorf("allreduce: rank %d refused rank %d: %w", l.cfg.next(), l.cfg.Rank, &mismatchError{trimNUL(rej.PrivateData)})
		case ctx.Err() != nil:
			return fmt.Errorf("allreduce: rank %d: could not connect to rank %d at %v within %v: %v", l.cfg.Rank, l.cfg.next(), next, l.cfg.Timeout, err)
		}
		// Not listening yet (REJ 8) or not up (CM timeout): again. A
		// failed Dial left the QP in ERR or RESET; a fresh one is needed.
		_ = l.qpNext.Destroy()
		q, qerr := l.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: l.cq, RecvCQ: l.cq,
			Cap: ib.QPCap{MaxSendWR: 8, MaxRecvWR: recvDepth, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if qerr != nil {
			return qerr
		}
		l.qpNext = q
		if err := ib.InitQP(q, ib.ConnectAttr{}); err != nil {
			return err
		}
		for range recvDepth {
			if err := q.PostRecv(ib.RecvWR{}); err != nil {
				return err
			}
		}
		for l.cq.Poll(l.wcs) > 0 { // the old QP's flushed receives
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func trimNUL(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// poll handles completions until cond holds.
func (l *rdmaLink) poll(ctx context.Context, cond func() bool) error {
	for !cond() {
		n, err := l.cq.WaitPoll(ctx, l.wcs)
		if err != nil {
			return err
		}
		for _, wc := range l.wcs[:n] {
			if wc.Status != ib.WCSuccess {
				peer := l.cfg.next()
				if wc.QPNum == l.qpPrev.Num() {
					peer = l.cfg.prev()
				}
				return fmt.Errorf("work completion %v on the connection to rank %d", wc.Status, peer)
			}
			switch wc.Opcode {
			case ib.WCRecvRDMAWithImm:
				l.arrived[wc.Imm] = true
				if err := l.qpPrev.PostRecv(ib.RecvWR{}); err != nil {
					return err
				}
			case ib.WCRecv:
				l.credits++
				if err := l.qpNext.PostRecv(ib.RecvWR{}); err != nil {
					return err
				}
			case ib.WCRDMAWrite:
				l.inFlight--
			}
		}
	}
	return nil
}

func (l *rdmaLink) send(ctx context.Context, step uint32, b []byte) error {
	if err := l.poll(ctx, func() bool { return l.credits > 0 }); err != nil {
		return err
	}
	l.credits--
	slot := uint64(step % nSlots)
	off := uint64(len(b))
	if len(b) > 0 {
		off = uint64(uintptrOf(b) - l.dataMR.IOVA())
	}
	var sgl []ib.SGE
	if len(b) > 0 {
		sgl = []ib.SGE{{Addr: l.dataMR.IOVA() + off, Length: uint32(len(b)), LKey: l.dataMR.LKey()}}
	}
	err := l.qpNext.PostSend(ib.SendWR{Opcode: ib.WRRDMAWriteWithImm, Flags: ib.SendSignaled, SGL: sgl, Imm: step,
		RemoteAddr: l.remote.slotAddr + slot*uint64(l.remote.slotSize), RKey: l.remote.slotRKey})
	if err != nil {
		return err
	}
	l.inFlight++
	return nil
}

func (l *rdmaLink) recv(ctx context.Context, step uint32, n int) ([]byte, error) {
	if err := l.poll(ctx, func() bool { return l.arrived[step] }); err != nil {
		return nil, err
	}
	delete(l.arrived, step)
	// The previous rank may be one step ahead (two slots), never more:
	// its credits stop it.
	for s := range l.arrived {
		if s != step+1 {
			return nil, fmt.Errorf("chunk of step %d arrived while expecting step %d", s, step)
		}
	}
	size := len(l.slots) / nSlots
	off := int(step%nSlots) * size
	return l.slots[off : off+n], nil
}

// release hands the slot back to the previous rank.
func (l *rdmaLink) release(ctx context.Context, step uint32) error {
	return l.qpPrev.PostSend(ib.SendWR{Opcode: ib.WRSend, Flags: ib.SendSignaled})
}

func (l *rdmaLink) waitSent(ctx context.Context) error {
	return l.poll(ctx, func() bool { return l.inFlight == 0 })
}

func (l *rdmaLink) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if l.l != nil {
		_ = l.l.Close()
	}
	for _, c := range []*rdmacm.Conn{l.cNext, l.cPrev} {
		if c != nil {
			_ = c.Disconnect(ctx)
		}
	}
	for _, q := range []*ib.QP{l.qpNext, l.qpPrev} {
		if q != nil {
			_ = q.Destroy()
		}
	}
	for _, m := range []*ib.MR{l.dataMR, l.slotsMR} {
		if m != nil {
			_ = m.Dereg()
		}
	}
	if l.cq != nil {
		_ = l.cq.Destroy()
	}
	if l.pd != nil {
		_ = l.pd.Dealloc()
	}
	return nil
}
