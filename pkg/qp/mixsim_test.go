package qp

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

type mixOp struct {
	op         WROpcode
	size       int
	loff, roff int
	add        uint64
	cmp, swap  uint64
}

const mixW, mixA, mixR = 64 << 10, 128 << 10, 256 << 10

type mixStream struct {
	t        *testing.T
	src, dst *end
	mb       int
	ops      []mixOp
	expRecv  [][]byte
	expOrig  []uint64
	model    []byte
	atom     []uint64
	posted   int
	done     int
	recvd    int
	nrecv    int
	origIdx  int
	window   int
	lazy     bool
	rng      *rand.Rand
	fails    []string
}

func newMixStream(t *testing.T, rng *rand.Rand, src, dst *end, mb int, seedb byte) *mixStream {
	s := &mixStream{t: t, src: src, dst: dst, mb: mb, rng: rng, model: make([]byte, 64<<10), atom: make([]uint64, 16)}
	for i := range s.atom {
		s.atom[i] = uint64(i)*1000 + uint64(seedb)
		binary.NativeEndian.PutUint64(dst.buf[mixA+8*i:], s.atom[i])
	}
	sizes := func() int {
		switch rng.IntN(6) {
		case 0:
			return 0
		case 1:
			return 1 + rng.IntN(8)
		case 2:
			return mb
		case 3:
			return mb*(1+rng.IntN(4)) + rng.IntN(3) - 1
		default:
			return 1 + rng.IntN(5*mb)
		}
	}
	nops := 40 + rng.IntN(40)
	for i := 0; i < nops; i++ {
		var o mixOp
		switch rng.IntN(7) {
		case 0, 1:
			o.op = WRSend
			if rng.IntN(2) == 0 {
				o.op = WRSendWithImm
			}
			o.size = sizes()
			o.loff = rng.IntN(64<<10 - o.size)
			s.expRecv = append(s.expRecv, append([]byte(nil), src.buf[o.loff:o.loff+o.size]...))
		case 2, 3:
			o.op = WRRDMAWrite
			if rng.IntN(3) == 0 {
				o.op = WRRDMAWriteWithImm
				s.expRecv = append(s.expRecv, nil)
			}
			o.size = sizes()
			o.loff = rng.IntN(64<<10 - o.size)
			o.roff = rng.IntN(64<<10 - o.size)
			copy(s.model[o.roff:], src.buf[o.loff:o.loff+o.size])
		case 4, 5:
			o.op = WRRDMARead
			o.size = sizes()
			o.roff = rng.IntN(64<<10 - o.size)
		case 6:
			k := rng.IntN(16)
			o.roff = mixA + 8*k
			o.size = 8
			if rng.IntN(2) == 0 {
				o.op = WRAtomicFetchAndAdd
				o.add = uint64(rng.IntN(100) + 1)
				s.expOrig = append(s.expOrig, s.atom[k])
				s.atom[k] += o.add
			} else {
				o.op = WRAtomicCmpAndSwp
				o.cmp = s.atom[k]
				if rng.IntN(3) == 0 {
					o.cmp++
				}
				o.swap = uint64(rng.Uint32())
				s.expOrig = append(s.expOrig, s.atom[k])
				if s.atom[k] == o.cmp {
					s.atom[k] = o.swap
				}
			}
		}
		s.ops = append(s.ops, o)
	}
	s.window = 1 + rng.IntN(16)
	s.lazy = rng.IntN(3) == 0
	return s
}

func (s *mixStream) resSlot(i int) int { return 512<<10 + (i%20)*(6*1024) }
func (s *mixStream) recvOff(i int) int { return mixR + (i%40)*(6*s.mb) }

func (s *mixStream) postRecv(force bool) {
	if s.lazy && !force && s.rng.IntN(50) != 0 {
		return
	}
	for s.dst.q.RecvQueueLen() < 32 && s.nrecv < len(s.expRecv) {
		require.NoError(s.t, s.dst.q.PostRecv(&RecvWR{ID: uint64(s.nrecv), SGL: []SGE{s.dst.sge(s.recvOff(s.nrecv), 6*s.mb)}}))
		s.nrecv++
	}
}

func (s *mixStream) post() {
	for s.posted < len(s.ops) && s.posted-s.done < s.window {
		o := s.ops[s.posted]
		wr := SendWR{ID: uint64(s.posted), Opcode: o.op, Flags: Signaled, Imm: uint32(s.posted)}
		switch o.op {
		case WRSend, WRSendWithImm:
			wr.SGL = []SGE{s.src.sge(o.loff, o.size)}
		case WRRDMAWrite, WRRDMAWriteWithImm:
			wr.SGL = []SGE{s.src.sge(o.loff, o.size)}
			wr.RemoteAddr, wr.RKey = s.dst.m.IOVA()+uint64(mixW+o.roff), s.dst.m.RKey()
		case WRRDMARead:
			clear(s.src.buf[s.resSlot(s.posted) : s.resSlot(s.posted)+6*1024])
			wr.SGL = []SGE{s.src.sge(s.resSlot(s.posted), o.size)}
			wr.RemoteAddr, wr.RKey = s.dst.m.IOVA()+uint64(o.roff), s.dst.m.RKey()
		default:
			clear(s.src.buf[s.resSlot(s.posted) : s.resSlot(s.posted)+8])
			wr.SGL = []SGE{s.src.sge(s.resSlot(s.posted), 8)}
			wr.RemoteAddr, wr.RKey = s.dst.m.IOVA()+uint64(o.roff), s.dst.m.RKey()
			wr.CompareAdd, wr.Swap = o.add, o.swap
			if o.op == WRAtomicCmpAndSwp {
				wr.CompareAdd = o.cmp
			}
		}
		if len(wr.SGL) > 0 && wr.SGL[0].Length == 0 {
			wr.SGL = nil
		}
		require.NoError(s.t, s.src.q.PostSend(&wr))
		s.posted++
	}
}

func (s *mixStream) check() {
	for _, wc := range poll(s.t, s.src.scq) {
		if wc.Status != WCSuccess {
			s.fails = append(s.fails, fmt.Sprintf("qp %#x send wr %d (%v): %v", s.src.q.Num(), wc.ID, s.ops[wc.ID].op, wc.Status))
			continue
		}
		if int(wc.ID) != s.done {
			s.fails = append(s.fails, fmt.Sprintf("send wc %d, want %d", wc.ID, s.done))
		}
		o := s.ops[wc.ID]
		switch o.op {
		case WRRDMARead:
			got := s.src.buf[s.resSlot(int(wc.ID)) : s.resSlot(int(wc.ID))+o.size]
			if string(got) != string(s.dst.buf[o.roff:o.roff+o.size]) {
				s.fails = append(s.fails, fmt.Sprintf("READ wr %d data wrong (size %d)", wc.ID, o.size))
			}
		case WRAtomicFetchAndAdd, WRAtomicCmpAndSwp:
			got := binary.NativeEndian.Uint64(s.src.buf[s.resSlot(int(wc.ID)):])
			if got != s.expOrig[s.origIdx] {
				s.fails = append(s.fails, fmt.Sprintf("atomic wr %d orig %d want %d", wc.ID, got, s.expOrig[s.origIdx]))
			}
			s.origIdx++
		}
		s.done++
	}
	for _, wc := range poll(s.t, s.dst.rcq) {
		if wc.Status != WCSuccess {
			s.fails = append(s.fails, fmt.Sprintf("qp %#x recv %d: %v", s.dst.q.Num(), wc.ID, wc.Status))
			continue
		}
		if int(wc.ID) != s.recvd {
			s.fails = append(s.fails, fmt.Sprintf("recv wc %d want %d", wc.ID, s.recvd))
		}
		if exp := s.expRecv[s.recvd]; exp != nil {
			off := s.recvOff(int(wc.ID))
			if int(wc.ByteLen) != len(exp) || string(s.dst.buf[off:off+len(exp)]) != string(exp) {
				s.fails = append(s.fails, fmt.Sprintf("recv %d data/len wrong: len %d want %d", wc.ID, wc.ByteLen, len(exp)))
			}
		}
		s.recvd++
	}
	s.post()
	s.postRecv(false)
}

func (s *mixStream) finished() bool { return s.done == len(s.ops) && s.recvd == len(s.expRecv) }

func (s *mixStream) final() {
	if string(s.dst.buf[mixW:mixW+64<<10]) != string(s.model) {
		first, last := -1, -1
		for i := range s.model {
			if s.model[i] != s.dst.buf[mixW+i] {
				if first < 0 {
					first = i
				}
				last = i
			}
		}
		s.fails = append(s.fails, fmt.Sprintf("qp %#x write region differs [%d,%d]", s.dst.q.Num(), first, last))
	}
	for k := range s.atom {
		if got := binary.NativeEndian.Uint64(s.dst.buf[mixA+8*k:]); got != s.atom[k] {
			s.fails = append(s.fails, fmt.Sprintf("atomic %d = %d want %d", k, got, s.atom[k]))
		}
	}
}

// TestMixedOperationsUnderLossMatchTheModel runs two RC QPs (one or
// both directions) through seeded random mixes of SEND, SEND with
// immediate, WRITE, WRITE with immediate, READ and both atomics, of sizes
// around the MTU, at PSNs that cross the 2^24 wrap, over a simulated link
// that loses, duplicates and reorders packets, with receives posted late
// and small run budgets, on the injected clock. Every completion, every
// received byte, the written region and the atomic results are checked
// against a model of what the operations must have done. MIXSEEDS=n runs
// seeds 1..n instead of the default 1..mixDefaultSeeds, MIXSEED=k only
// seed k, MIXTRACE=1 logs every packet.
//
// The seeds are fixed, so the outcome is too. A seed can fail for a
// reason that is not a defect: at 10% loss each try of a request loses
// it or its answer 19% of the time, and 8 in a row exhaust retry_cnt 7
// (RETRY_EXC_ERR, as IBA requires); seed 20720 does that to an atomic.
//
// Written by the protocol audit of session AF, where it found the READ
// hold that resumed a partly sent WRITE under the wrong PSN (silent data
// corruption; TestReadHoldEndKeepsPartlySentWritePSNs).
func TestMixedOperationsUnderLossMatchTheModel(t *testing.T) {
	lo, hi := uint64(1), uint64(mixDefaultSeeds)
	if testing.Short() {
		hi = mixDefaultSeeds / 4
	}
	if s := os.Getenv("MIXSEEDS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "MIXSEEDS")
		hi = uint64(n)
	}
	if s := os.Getenv("MIXSEED"); s != "" {
		v, err := strconv.Atoi(s)
		require.NoError(t, err, "MIXSEED")
		lo, hi = uint64(v), uint64(v)
	}
	for seed := lo; seed <= hi; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runMix(t, seed) })
	}
}

// mixDefaultSeeds is how many seeds a plain go test runs.
const mixDefaultSeeds = 1000

func runMix(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	mtus := []MTU{MTU256, MTU512, MTU1024}
	mtu := mtus[rng.IntN(3)]
	l := &link{t: t, a: newEnd(t, RC, 0x11, "10.0.0.1"), b: newEnd(t, RC, 0x12, "10.0.0.2"), now: time.Unix(1000, 0)}
	if rng.IntN(4) == 0 {
		l.a.q.ibaTimerOnly = true
		l.b.q.ibaTimerOnly = true
	}
	start := [2]PSN{PSN(0xFFFFFF - uint32(rng.IntN(40))), PSN(rng.IntN(1 << 24))}
	rd := uint8(1 + rng.IntN(4))
	timeout := uint8(8 + rng.IntN(8))
	for i, p := range [][2]*end{{l.a, l.b}, {l.b, l.a}} {
		x, y := p[0], p[1]
		require.NoError(t, x.q.Modify(&Attr{State: Init, PortNum: 1,
			AccessFlags: AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic},
			AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags, l.now))
		require.NoError(t, x.q.Modify(&Attr{State: RTR, AV: AddrVector{DGID: y.addr.Addr()}, PathMTU: mtu,
			DestQPN: y.q.Num(), RQPSN: start[1-i], MaxDestRdAtomic: rd, MinRNRTimer: 1},
			AttrState|AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRdAtomic|AttrMinRNRTimer, l.now))
		require.NoError(t, x.q.Modify(&Attr{State: RTS, SQPSN: start[i], Timeout: timeout, RetryCnt: 7,
			RNRRetry: 7, MaxRdAtomic: rd},
			AttrState|AttrSQPSN|AttrTimeout|AttrRetryCnt|AttrRNRRetry|AttrMaxQPRdAtomic, l.now))
	}
	mb := mtu.Bytes()
	for i := 0; i < 64<<10; i++ {
		l.a.buf[i] = byte(i*7 + 3)
		l.b.buf[i] = byte(i*13 + 5)
	}
	var streams []*mixStream
	streams = append(streams, newMixStream(t, rng, l.a, l.b, mb, 1))
	if rng.IntN(2) == 0 {
		streams = append(streams, newMixStream(t, rng, l.b, l.a, mb, 2))
	}
	for _, s := range streams {
		s.postRecv(true)
		s.post()
	}
	loss := []float64{0, 0.02, 0.05, 0.1, 0.1}[rng.IntN(5)]
	budget := []int{1, 2, 5, 64}[rng.IntN(4)]
	dup := []float64{0, 0.02, 0.05}[rng.IntN(3)]
	reorder := []float64{0, 0.02, 0.05}[rng.IntN(3)]
	trace := os.Getenv("MIXTRACE") != ""
	var inflight []simPkt
	collect := func(src, dst *end) {
		for _, p := range src.env.take() {
			if rng.Float64() < loss {
				continue
			}
			inflight = append(inflight, simPkt{dst: dst, src: src, raw: p})
			if rng.Float64() < dup {
				inflight = append(inflight, simPkt{dst: dst, src: src, raw: p})
			}
		}
	}
	allDone := func() bool {
		for _, s := range streams {
			if !s.finished() {
				return false
			}
		}
		return true
	}
	failed := func() bool {
		for _, s := range streams {
			if len(s.fails) > 0 {
				return true
			}
		}
		return false
	}
	for step := 0; step < 3_000_000; step++ {
		for _, s := range streams {
			if s.lazy && step%100 == 0 {
				s.postRecv(true)
			}
			s.check()
		}
		if failed() || allDone() {
			break
		}
		l.a.q.Run(l.a.env, l.now, budget)
		l.b.q.Run(l.b.env, l.now, budget)
		collect(l.a, l.b)
		collect(l.b, l.a)
		if len(inflight) > 0 {
			i := 0
			if len(inflight) > 1 && rng.Float64() < reorder {
				i = 1 + rng.IntN(min(len(inflight)-1, 8))
			}
			p := inflight[i]
			inflight = append(inflight[:i], inflight[i+1:]...)
			var pk wire.Packet
			require.NoError(t, pk.Parse(p.raw))
			if trace {
				dir := "a->b"
				if p.src == l.b {
					dir = "b->a"
				}
				extra := ""
				if pk.AETH != nil {
					extra = fmt.Sprintf(" syn %#x msn %d", uint8(pk.AETH.Syndrome()), pk.AETH.MSN())
				}
				if pk.RETH != nil {
					extra += fmt.Sprintf(" va %#x len %d", pk.RETH.VA()-p.dst.m.IOVA(), pk.RETH.DMALen())
				}
				t.Logf("%v %s %v psn %v pay %d%s", l.now.Sub(time.Unix(1000, 0)), dir, pk.Opcode, PSN(pk.BTH.PSN()), len(pk.Payload), extra)
			}
			ri := RecvInfo{Src: p.src.addr, Dst: p.dst.addr}
			if p.dst.q.Check(&pk, &ri, p.dst.addr.Addr()) == DropNone {
				p.dst.q.Receive(p.dst.env, &pk, &ri, l.now)
			}
			l.now = l.now.Add(time.Microsecond)
			continue
		}
		d := l.a.q.Deadline()
		if db := l.b.q.Deadline(); !db.IsZero() && (d.IsZero() || db.Before(d)) {
			d = db
		}
		if d.IsZero() {
			for _, s := range streams {
				s.check()
			}
			if allDone() || failed() {
				break
			}
			// maybe waiting on lazy receives
			for _, s := range streams {
				s.postRecv(true)
			}
			l.now = l.now.Add(time.Millisecond)
			if step%1000 == 999 {
				break
			}
			continue
		}
		if d.After(l.now) {
			l.now = d
		}
		if trace {
			t.Logf("%v timer", l.now.Sub(time.Unix(1000, 0)))
		}
		l.a.q.OnTimer(l.a.env, l.now, budget)
		l.b.q.OnTimer(l.b.env, l.now, budget)
	}
	var fails []string
	for _, s := range streams {
		if len(s.fails) == 0 && !s.finished() {
			s.fails = append(s.fails, fmt.Sprintf("qp %#x stalled: done %d/%d recvd %d/%d state %v/%v", s.src.q.Num(), s.done, len(s.ops), s.recvd, len(s.expRecv), s.src.q.State(), s.dst.q.State()))
		}
		if len(s.fails) == 0 {
			s.final()
		}
		fails = append(fails, s.fails...)
	}
	if len(fails) > 0 {
		t.Fatalf("streams %d mtu %d rd %d budget %d loss %v dup %v reorder %v start %v iba %v: %v", len(streams), mb, rd, budget, loss, dup, reorder, start, l.a.q.ibaTimerOnly, fails[:min(len(fails), 5)])
	}
}
