package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/oob"
)

// Atomic operands: FETCH_AND_ADD adds 1; CMP_AND_SWAP swaps 0 for
// perfSwapValue, so the first one succeeds on zeroed memory and the rest
// return the swapped value.
const perfSwapValue = 0x0123456789abcdef

// run performs the measured part and the closing exchanges.
func (r *perfRun) run(ctx context.Context, sess perfFinisher, local oob.Key, closed *bool) error {
	o := r.o
	t := o.test
	var my oob.BWReport
	var err error
	switch {
	case t.Latency && r.server() && t.ServerIdles():
	case t.Latency:
		var st oob.LatencyStats
		st, err = r.runLatency(ctx)
		if err == nil {
			err = oob.WriteLatencyResult(r.stdout, o.size, int(o.iters), st)
		}
	case t.Verb == oob.VerbSend && r.server():
		if my, err = r.runSendServer(ctx); err == nil {
			err = oob.WriteBWResult(r.stdout, my, nil, o.gbits)
		}
	case r.server():
		// write/read/atomic bandwidth: the server idles while the client runs.
	default:
		sizes := []uint64{o.size}
		if o.all {
			sizes = sizes[:0]
			for s := uint64(2); s <= perfAllMax; s *= 2 {
				sizes = append(sizes, s)
			}
		}
		for _, s := range sizes {
			if my, err = r.runBW(ctx, int(s)); err != nil {
				break
			}
			if err = oob.WriteBWResult(r.stdout, my, nil, o.gbits); err != nil {
				break
			}
		}
	}
	if err != nil {
		return err
	}
	if readBack, _ := r.serveValidation(); o.validate && r.serveExport && readBack {
		if err := r.readBackExport(ctx); err != nil { // perf_serve.go
			return err
		}
	}
	remote, err := sess.Finish(ctx, t, local, my)
	*closed = true
	if err != nil {
		return err
	}
	var verr error
	if r.server() && t.ExchangesReports() {
		if err := oob.WriteBWResult(r.stdout, remote, nil, o.gbits); err != nil {
			return err
		}
		if o.validate {
			verr = r.validateServer(remote)
			// UC completes a WRITE when it is sent, so the report can
			// overtake the last packets: give them a moment to land.
			for deadline := time.Now().Add(min(o.ef.timeout, 2*time.Second)); verr != nil && o.conn == ib.UC && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
				verr = r.validateServer(remote)
			}
		}
	}
	_, _ = r.stdout.Write([]byte(oob.ResultLine))
	if note := r.validateNote(); verr == nil && o.validate && !r.peer && note != "" {
		fmt.Fprintf(r.stderr, "rxed perf: --validate: %s\n", note) // perf_serve.go
	}
	return verr
}

// waitWC waits for completions with the stall timeout. what describes the
// wait for an error; it is only called then, so that the measured loops
// do not format a message per poll.
func (r *perfRun) waitWC(ctx context.Context, wcs []ib.WC, what func() string) (int, error) {
	if r.wait == nil || r.wait.parent != ctx {
		r.wait = newCQWaiter(ctx, r.o.events, r.o.ef.spin, r.o.ef.timeout)
	}
	n, err := r.wait.next(r.cq, wcs)
	if err != nil {
		return 0, fmt.Errorf("no completion within %v while %s (peer gone?)", r.o.ef.timeout, what())
	}
	for _, wc := range wcs[:n] {
		if wc.Status != ib.WCSuccess {
			return 0, fmt.Errorf("completion with error %s (wr_id %d, QP %#x) while %s", wc.Status, wc.ID, wc.QPNum, what())
		}
	}
	return n, nil
}

// bwProgress is where a bandwidth run stood when it failed: total
// completions of the -n the QPs had to do, or of a -D run, which has no
// count.
func (o *perfOpts) bwProgress(total uint64, qps int) string {
	if o.duration > 0 {
		return fmt.Sprintf("running %s (%d done, -D %v)", o.test, total, o.duration)
	}
	return fmt.Sprintf("running %s (%d of %d done)", o.test, total, o.iters*uint64(qps))
}

// qpByNum returns the index of the QP numbered n, or -1.
func (r *perfRun) qpByNum(n uint32) int {
	return slices.IndexFunc(r.qps, func(q *perfQP) bool { return q.qp.Num() == n })
}

// bwQP is the per-QP state of a bandwidth run.
type bwQP struct {
	posted, done uint64
	pending      []int // global sample index per posted, uncompleted WR, oldest first
	firstRead    []byte
	// atomic checks the atomics' results as they complete (--validate),
	// shared by the QPs with the same target (atomicChecks).
	atomic *atomicCheck
}

// sendWR builds the work request of iteration seq on q.
func (r *perfRun) sendWR(q *perfQP, seq uint64, size int, signaled bool) ib.SendWR {
	o := r.o
	wr := ib.SendWR{ID: seq, RemoteAddr: q.remote.VAddr, RKey: q.remote.RKey}
	if signaled {
		wr.Flags = ib.SendSignaled
	}
	src, length := r.mr.IOVA()+uint64(q.src), uint32(size)
	switch o.test.Verb {
	case oob.VerbWrite:
		wr.Opcode = ib.WRRDMAWrite
	case oob.VerbRead:
		wr.Opcode = ib.WRRDMARead
		src += (seq % 2) * uint64(size)
	case oob.VerbAtomic:
		src, length = src+(seq%uint64(o.txDepth))*8, 8
		if o.atomicType == "CMP_AND_SWAP" {
			wr.Opcode, wr.CompareAdd, wr.Swap = ib.WRAtomicCmpAndSwp, 0, perfSwapValue
		} else {
			wr.Opcode, wr.CompareAdd = ib.WRAtomicFetchAndAdd, 1
		}
	case oob.VerbSend:
		wr.Opcode = ib.WRSend
		if o.conn == ib.UD {
			ib.UDSend(&wr, q.ah, q.remote.QPN, perfQKey)
		}
	}
	// PostSend copies the SGL, so every WR of q can use q.sge: no
	// allocation per WR.
	q.sge[0] = ib.SGE{Addr: src, Length: length, LKey: r.mr.LKey()}
	wr.SGL = q.sge[:]
	return wr
}

// runBW is the client side of a bandwidth test: keep up to -t work
// requests outstanding on every QP, one in -Q signaled, until -n per QP
// (or -D seconds) are done.
func (r *perfRun) runBW(ctx context.Context, size int) (oob.BWReport, error) {
	o := r.o
	cqMod := uint64(o.cqMod)
	if o.duration > 0 {
		cqMod = 1 // the run may stop anywhere: every WR reports itself
	}
	st := make([]bwQP, len(r.qps))
	r.atomicChecks(st)
	rec := o.bwRecord(len(r.qps))
	start := time.Now()
	stopAt := start.Add(o.duration)
	nextProgress := start.Add(o.progress)
	stopping := false
	wcs := make([]ib.WC, 64)
	var total uint64
	for {
		now := time.Now()
		if o.duration > 0 && !stopping && !now.Before(stopAt) {
			stopping = true
		}
		active := false
		for i, q := range r.qps {
			s := &st[i]
			for !stopping && s.posted-s.done < uint64(o.txDepth) && (o.duration > 0 || s.posted < o.iters) {
				seq := s.posted
				last := o.duration == 0 && seq+1 == o.iters
				wr := r.sendWR(q, seq, size, (seq+1)%cqMod == 0 || last)
				idx := rec.post(time.Since(start))
				if err := q.qp.PostSend(wr); err != nil {
					return oob.BWReport{}, fmt.Errorf("posting %s %d on QP %#x: %v", wr.Opcode, seq, q.qp.Num(), err)
				}
				s.pending = append(s.pending, idx)
				s.posted++
			}
			if s.done < s.posted {
				active = true
			}
		}
		if !active && (stopping || o.duration == 0) {
			break
		}
		n, err := r.waitWC(ctx, wcs, func() string { return o.bwProgress(total, len(r.qps)) })
		if err != nil {
			return oob.BWReport{}, err
		}
		at := time.Since(start)
		for _, wc := range wcs[:n] {
			i := r.qpByNum(wc.QPNum)
			if i < 0 {
				return oob.BWReport{}, fmt.Errorf("completion for unknown QP %#x", wc.QPNum)
			}
			q, s := r.qps[i], &st[i]
			for s.done <= wc.ID && len(s.pending) > 0 {
				seq := s.done
				rec.complete(s.pending[0], at)
				s.pending = s.pending[1:]
				s.done++
				total++
				if o.validate {
					if err := r.checkCompletion(q, s, seq, size); err != nil {
						return oob.BWReport{}, err
					}
				}
			}
		}
		if o.progress > 0 && time.Now().After(nextProgress) {
			el := time.Since(start).Seconds()
			fmt.Fprintf(r.stderr, "rxed perf: %s size %d: %d iterations in %.1f s, %.2f MB/sec\n", o.test, size, total, el,
				float64(total)*float64(size)/el/(1<<20))
			nextProgress = time.Now().Add(o.progress)
		}
	}
	if o.validate {
		if err := r.checkAtomicResults(st); err != nil {
			return oob.BWReport{}, err
		}
	}
	return rec.report(uint64(size), int(cqMod), o.gbits)
}

var errNoIterations = errors.New("no iterations completed")

// computeBW finds the figures perftest prints; the peak search is
// quadratic, so very long runs report no peak.
func computeBW(size uint64, posted, completed []time.Duration, cqMod int, gbits bool) (oob.BWReport, error) {
	n := len(posted)
	if n == 0 {
		return oob.BWReport{}, errNoIterations
	}
	s := oob.BWSamples{Size: size, Posted: posted, Completed: completed, CQMod: cqMod, Gbits: gbits}
	if float64(n)*float64(n)/float64(cqMod) > 5e7 {
		s.NoPeak = true
		completed[0] = slices.Max(completed) // NoPeak: Completed[0] is the end of the run
	}
	return oob.ComputeBW(s)
}

// checkCompletion validates what a completed work request brought back.
func (r *perfRun) checkCompletion(q *perfQP, s *bwQP, seq uint64, size int) error {
	switch r.o.test.Verb {
	case oob.VerbRead:
		off := q.src + int(seq%2)*size
		got := r.buf[off : off+size]
		if r.peer {
			if j := checkPattern(got); j >= 0 {
				return fmt.Errorf("validation: READ %d on QP %#x: byte %d is %#02x, want %#02x", seq, q.qp.Num(), j, got[j], patternByte(j))
			}
			return nil
		}
		if s.firstRead == nil {
			s.firstRead = bytes.Clone(got)
		} else if !bytes.Equal(s.firstRead, got) {
			return fmt.Errorf("validation: READ %d on QP %#x returned other bytes than the first READ of the same memory", seq, q.qp.Num())
		}
	case oob.VerbAtomic:
		off := q.src + int(seq%uint64(r.o.txDepth))*8
		if s.atomic == nil {
			s.atomic = r.newAtomicCheck(q)
		}
		return s.atomic.add(binary.NativeEndian.Uint64(r.buf[off : off+8]))
	}
	return nil
}

// atomicChecks gives the QPs of an atomic run their checks, one per
// target: QPs whose keys name the same memory share it.
func (r *perfRun) atomicChecks(st []bwQP) {
	if r.o.test.Verb != oob.VerbAtomic || !r.o.validate {
		return
	}
	type target struct {
		rkey  uint32
		vaddr uint64
	}
	byTarget := map[target]*atomicCheck{}
	for i, q := range r.qps {
		k := target{q.remote.RKey, q.remote.VAddr}
		if byTarget[k] == nil {
			byTarget[k] = r.newAtomicCheck(q)
		}
		st[i].atomic = byTarget[k]
	}
}

func (r *perfRun) newAtomicCheck(q *perfQP) *atomicCheck {
	return &atomicCheck{vaddr: q.remote.VAddr, cas: r.o.atomicType == "CMP_AND_SWAP"}
}

// checkAtomicResults is the final check of the atomics' results, once
// every one completed (atomicCheck.finish), per target.
func (r *perfRun) checkAtomicResults(st []bwQP) error {
	if r.o.test.Verb != oob.VerbAtomic {
		return nil
	}
	var done []*atomicCheck
	for i := range st {
		c := st[i].atomic
		if c == nil || slices.Contains(done, c) {
			continue
		}
		done = append(done, c)
		if err := c.finish(r.peer); err != nil {
			return err
		}
	}
	return nil
}

// validateServer checks the server's memory after a write or atomic
// bandwidth run of an rxed client, using the client's report.
func (r *perfRun) validateServer(rep oob.BWReport) error {
	if !r.peer {
		return nil
	}
	for _, q := range r.qps {
		tg := r.buf[q.target:]
		switch r.o.test.Verb {
		case oob.VerbWrite:
			if rep.Size > uint64(r.o.maxSize()) {
				return fmt.Errorf("validation: the client wrote %d bytes, more than our %d-byte buffer", rep.Size, r.o.maxSize())
			}
			if j := checkPattern(tg[:rep.Size]); j >= 0 {
				return fmt.Errorf("validation: QP %#x: byte %d of the written buffer is %#02x, want %#02x", q.qp.Num(), j, tg[j], patternByte(j))
			}
		case oob.VerbAtomic:
			v := binary.NativeEndian.Uint64(tg[:8])
			want := rep.Iters / uint64(len(r.qps))
			if r.o.atomicType == "CMP_AND_SWAP" {
				want = perfSwapValue
			}
			if v != want {
				return fmt.Errorf("validation: QP %#x: the atomic target holds %#x, want %#x after %d iterations", q.qp.Num(), v, want, rep.Iters)
			}
		}
	}
	return nil
}

// runSendServer receives -n messages per QP and measures like perftest's
// receiving side (no peak).
func (r *perfRun) runSendServer(ctx context.Context) (oob.BWReport, error) {
	o := r.o
	want := o.iters * uint64(len(r.qps))
	wcs := make([]ib.WC, 64)
	var got uint64
	var start time.Time
	perQP := map[uint32]uint64{}
	for got < want {
		n, err := r.waitWC(ctx, wcs, func() string { return fmt.Sprintf("receiving %s messages (%d of %d)", o.test, got, want) })
		if err != nil {
			return oob.BWReport{}, err
		}
		if start.IsZero() {
			start = time.Now()
		}
		for _, wc := range wcs[:n] {
			if !wc.Opcode.IsRecv() {
				continue
			}
			i := r.qpByNum(wc.QPNum)
			if i < 0 {
				return oob.BWReport{}, fmt.Errorf("completion for unknown QP %#x", wc.QPNum)
			}
			q := r.qps[i]
			if err := r.checkRecv(q, wc, perQP[wc.QPNum]); err != nil {
				return oob.BWReport{}, err
			}
			perQP[wc.QPNum]++
			got++
			if err := r.postRecv(q, int(wc.ID)); err != nil {
				return oob.BWReport{}, err
			}
		}
	}
	el := time.Since(start)
	if el <= 0 {
		el = time.Microsecond
	}
	return oob.AverageBW(o.size, want, el, o.gbits), nil
}

// checkRecv validates one received message in its slot.
func (r *perfRun) checkRecv(q *perfQP, wc ib.WC, i uint64) error {
	want := uint32(r.o.size)
	hdr := 0
	if r.o.conn == ib.UD {
		want += ppGRHLen
		hdr = ppGRHLen
	}
	if wc.ByteLen != want {
		return fmt.Errorf("validation: message %d on QP %#x has %d bytes, want %d", i, q.qp.Num(), wc.ByteLen, want)
	}
	if !r.o.validate || !r.peer {
		return nil
	}
	off := q.recv + int(wc.ID)*r.slotSz + hdr
	got := r.buf[off : off+int(r.o.size)]
	if j := checkPattern(got); j >= 0 {
		return fmt.Errorf("validation: message %d on QP %#x: byte %d is %#02x, want %#02x", i, q.qp.Num(), j, got[j], patternByte(j))
	}
	return nil
}

// runLatency is the measured part of the latency tests.
func (r *perfRun) runLatency(ctx context.Context) (oob.LatencyStats, error) {
	o := r.o
	var samples []time.Duration
	var err error
	switch o.test.Verb {
	case oob.VerbSend:
		samples, err = r.latPingPong(ctx, false)
	case oob.VerbWrite:
		samples, err = r.latPingPong(ctx, true)
	default:
		samples, err = r.latRequests(ctx)
	}
	if err != nil {
		return oob.LatencyStats{}, err
	}
	return oob.ComputeLatency(samples, o.test.RTTFactor())
}

// latRequests is read_lat / atomic_lat: one request at a time.
func (r *perfRun) latRequests(ctx context.Context) ([]time.Duration, error) {
	o := r.o
	q := r.qps[0]
	var s bwQP
	samples := make([]time.Duration, 0, o.iters)
	wcs := make([]ib.WC, 4)
	for seq := range o.iters {
		t0 := time.Now()
		if err := q.qp.PostSend(r.sendWR(q, seq, int(o.size), true)); err != nil {
			return nil, fmt.Errorf("posting request %d: %v", seq, err)
		}
		if _, err := r.waitWC(ctx, wcs, func() string { return fmt.Sprintf("waiting for request %d of %s", seq, o.test) }); err != nil {
			return nil, err
		}
		samples = append(samples, time.Since(t0))
		if o.validate {
			if err := r.checkCompletion(q, &s, seq, int(o.size)); err != nil {
				return nil, err
			}
		}
	}
	if o.validate {
		if err := r.checkAtomicResults([]bwQP{s}); err != nil {
			return nil, err
		}
	}
	return samples, nil
}

// latSendsFirst reports whether this side sends its first message
// before waiting for one, as perftest decides: in send_lat the client
// sends first (run_iter_lat_send: !(scnt < 1 && machine == CLIENT)), in
// write_lat the server writes first (run_iter_lat_write: !(scnt < 1 &&
// machine == SERVER)). Getting it wrong against a real peer deadlocks
// (both poll) or races: both write message 1, a side that already got
// its 1 writes 2 over it before the peer polled for 1, and the peer's
// poll for exactly 1 never ends.
func latSendsFirst(byWrite, server bool) bool {
	if byWrite {
		return server
	}
	return !server
}

// latPingPong is send_lat (byWrite=false: SEND/RECV) and write_lat
// (byWrite=true: RDMA WRITE, the receiver polls the last byte of its
// buffer, as perftest does). latSendsFirst says who starts.
func (r *perfRun) latPingPong(ctx context.Context, byWrite bool) ([]time.Duration, error) {
	o := r.o
	q := r.qps[0]
	size := int(o.size)
	iters := int(o.iters)
	samples := make([]time.Duration, 0, iters)
	wcs := make([]ib.WC, 4)
	sendBusy := false
	rcnt, scnt := 0, 0
	received := 0 // receive completions seen (send test)
	var t0 time.Time
	drain := func(what func() string, needRecv bool) error {
		for sendBusy || (needRecv && received <= rcnt) {
			n, err := r.waitWC(ctx, wcs, what)
			if err != nil {
				return err
			}
			for _, wc := range wcs[:n] {
				if wc.Opcode.IsRecv() {
					if err := r.checkRecv(q, wc, uint64(received)); err != nil {
						return err
					}
					if err := r.postRecv(q, int(wc.ID)); err != nil {
						return err
					}
					received++
				} else {
					sendBusy = false
				}
			}
		}
		return nil
	}
	src := r.buf[q.src : q.src+size]
	target := r.buf[q.target : q.target+size]
	for scnt < iters || rcnt < iters {
		if rcnt < iters && !(scnt == 0 && latSendsFirst(byWrite, r.server())) {
			what := func() string { return fmt.Sprintf("waiting for message %d of %s", rcnt+1, o.test) }
			if byWrite {
				if err := r.pollByte(ctx, target, size-1, byte(rcnt+1), what); err != nil {
					return nil, err
				}
				if o.validate && r.peer {
					if j := checkPattern(target[:size-1]); j >= 0 {
						return nil, fmt.Errorf("validation: write %d: byte %d is %#02x, want %#02x", rcnt+1, j, target[j], patternByte(j))
					}
				}
			} else if err := drain(what, true); err != nil {
				return nil, err
			}
			rcnt++
			if !t0.IsZero() {
				samples = append(samples, time.Since(t0))
			}
		}
		if scnt < iters {
			if err := drain(func() string { return "waiting for our previous send" }, false); err != nil {
				return nil, err
			}
			if byWrite {
				atomicStoreByte(src, size-1, byte(scnt+1))
			}
			t0 = time.Now()
			if err := q.qp.PostSend(r.sendWR(q, uint64(scnt), size, true)); err != nil {
				return nil, fmt.Errorf("posting %d: %v", scnt, err)
			}
			sendBusy = true
			scnt++
		}
	}
	if err := drain(func() string { return "waiting for the last send" }, false); err != nil {
		return nil, err
	}
	if len(samples) < 3 {
		return nil, fmt.Errorf("only %d latency samples", len(samples))
	}
	return samples, nil
}

// pollByte spins until b[i] == want, like perftest's volatile poll of the
// last byte of the buffer. The buffer is mmap'd memory the engine writes
// to; the aligned word is read atomically.
func (r *perfRun) pollByte(ctx context.Context, b []byte, i int, want byte, what func() string) error {
	deadline := time.Now().Add(r.o.ef.timeout)
	for spins := 0; ; spins++ {
		if atomicLoadByte(b, i) == want {
			return nil
		}
		if !r.o.events && r.en.dev.Progress() > 0 {
			continue // the engine received in this goroutine: look again
		}
		if spins&63 == 63 {
			runtime.Gosched()
			if spins&4095 == 4095 {
				if time.Now().After(deadline) {
					return fmt.Errorf("no data within %v while %s (peer gone?)", r.o.ef.timeout, what())
				}
				if err := ctx.Err(); err != nil {
					return err
				}
				time.Sleep(20 * time.Microsecond)
			}
		}
	}
}

var littleEndian = func() bool { x := uint16(1); return *(*byte)(unsafe.Pointer(&x)) == 1 }()

// wordOf returns the aligned 32-bit word holding b[i] and the byte's
// shift. b must start 4-byte aligned (the run's buffers are page-aligned
// mmap'd memory).
func wordOf(b []byte, i int) (*uint32, uint) {
	w := (*uint32)(unsafe.Pointer(&b[i&^3]))
	k := uint(i & 3)
	if !littleEndian {
		k = 3 - k
	}
	return w, 8 * k
}

func atomicLoadByte(b []byte, i int) byte {
	w, sh := wordOf(b, i)
	return byte(atomic.LoadUint32(w) >> sh)
}

func atomicStoreByte(b []byte, i int, v byte) {
	w, sh := wordOf(b, i)
	for {
		old := atomic.LoadUint32(w)
		nw := old&^(0xff<<sh) | uint32(v)<<sh
		if atomic.CompareAndSwapUint32(w, old, nw) {
			return
		}
	}
}
