package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// Fault-test layout. Each QP owns a disjoint area of the responder's
// buffer (so the model of one QP never depends on another's timing), a
// slice of requester slots for source/result data, and a slice of
// responder receive buffers.
const (
	ftArea      = 64 << 10 // responder bytes per QP targeted by WRITE/READ/atomics
	ftCounters  = 64       // 8-byte atomic counters at the start of each area
	ftSlot      = 8 << 10  // requester slot per outstanding WR
	ftSlots     = 32       // slots per QP (> window)
	ftWindow    = 16       // outstanding WRs per QP
	ftRecvSlot  = 8 << 10  // responder receive buffer
	ftRecvs     = 64       // receives kept posted per QP
	ftMaxLen    = 6000     // longest message
	ftRecvBase  = 8 << 20  // responder offset of the receive buffers
	ftSlotsBase = 0        // requester offset of the slots
)

// ftExpectRecv is a receive completion the responder must produce.
type ftExpectRecv struct {
	op   ib.WCOpcode
	data []byte // SEND payload (nil for WRITE_WITH_IMM)
	n    int
	imm  uint32
	hasI bool
}

// ftOp is one posted WR and what its completion must show.
type ftOp struct {
	id     uint64
	op     ib.WROpcode
	slot   int
	want   []byte // READ: bytes expected in the slot; atomics: original value
	length int
	off    int // READ: area offset read
}

// ftQP is the requester-side state of one QP and the model of its area.
type ftQP struct {
	idx      int
	a, b     *ib.QP
	model    []byte
	pending  []ftOp
	recvs    []ftExpectRecv
	posted   int // WRs posted
	done     int // requester completions seen
	recvDone int
	recvNext uint64 // next receive WR id to post on b
}

// TestFaultInjectionExactlyOnce runs mixed WRITE, WRITE_WITH_IMM, READ,
// SEND, SEND_WITH_IMM, CMP_SWP and FETCH_ADD over several RC QPs while
// both directions of both engines lose 10%, duplicate 5%, reorder 5% and
// corrupt 1% of the packets (fixed seeds), over IPv6 and over IPv4. Every
// WR must complete exactly once and successfully, every READ and atomic
// must return what a sequential model of its QP's area says, every SEND
// must arrive once with its bytes and immediate, and at the end the
// remote memory must equal the model. RXED_FAULT_OPS sets the number of
// operations (the acceptance run is 100000, about 30 s a family); the
// default keeps the test to seconds. RXED_FAULT_SPEC replaces the faults
// (transport.ParseFaultSpec syntax, e.g. "loss=0.2,seed=5,dir=send").
//
// IPv4 matters on its own: a UDP socket does not see the IPv4
// Identification the ICRC covers, so the ICRC alone is a 16-bit check
// there, and until the engine checked the solved ID (pkg/roce/ipv4id.go)
// this test failed over IPv4 with "SEND payload differs" (issue 17: 10%
// corruption, 100,000 ops, two seeds of two).
func TestFaultInjectionExactlyOnce(t *testing.T) {
	for _, fam := range []struct{ name, a, b string }{
		{"ipv6", "fd00::1", "fd00::2"},
		{"ipv4", "10.0.0.1", "10.0.0.2"},
	} {
		t.Run(fam.name, func(t *testing.T) { faultInjectionExactlyOnce(t, fam.a, fam.b) })
	}
}

func faultInjectionExactlyOnce(t *testing.T, addrA, addrB string) {
	total := 3000
	if s := os.Getenv("RXED_FAULT_OPS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		total = n
	}
	const nQP = 6
	seed := int64(20261130)
	net := transport.NewMemNetwork()
	var conns []transport.Conn
	mk := func(addr string, s int64) *node {
		a := netip.MustParseAddr(addr)
		c, err := net.Listen(netip.AddrPortFrom(a, transport.RoCEv2Port))
		require.NoError(t, err)
		conns = append(conns, c)
		fc := transport.FaultConfig{Loss: 0.10, Dup: 0.05, Reorder: 0.05, Corrupt: 0.01, Seed: s, Direction: transport.DirSend}
		if spec := os.Getenv("RXED_FAULT_SPEC"); spec != "" {
			var err error
			fc, err = transport.ParseFaultSpec(spec)
			require.NoError(t, err)
		}
		return newNode(t, ib.Config{Conn: c, Fault: &fc, Workers: 2}, a, nodeOpts{bufSize: 16 << 20, cqe: 1 << 14})
	}
	na := mk(addrA, seed)
	nb := mk(addrB, seed+1)
	o := qpOpts{mtu: ib.MTU1024, timeout: ftTimeout(total), retry: 7, rnrRetry: 7, minRNR: 1, maxRdAtomic: 16, sendWR: 64}
	rng := rand.New(rand.NewPCG(uint64(seed), 7))
	qps := make([]*ftQP, nQP)
	for i := range qps {
		a, b := na.createQP(o), nb.createQP(o)
		connectQPs(t, na, a, nb, b, o)
		q := &ftQP{idx: i, a: a, b: b, model: make([]byte, ftArea)}
		// Start from a known pattern in the area, mirrored in the model.
		fill(q.model, 1000+i)
		copy(nb.buf[i*ftArea:(i+1)*ftArea], q.model)
		for r := 0; r < ftRecvs; r++ {
			q.postRecv(t, nb)
		}
		qps[i] = q
	}
	byNumA := map[uint32]*ftQP{}
	byNumB := map[uint32]*ftQP{}
	for _, q := range qps {
		byNumA[q.a.Num()] = q
		byNumB[q.b.Num()] = q
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	posted, completed := 0, 0
	wcs := make([]ib.WC, 64)
	lastProgress := time.Now()
	connStats = func() string {
		out := ""
		for _, c := range conns {
			out += fmt.Sprintf("%+v ", c.(transport.StatsReporter).Stats())
		}
		// The responder's side too: a requester whose PSNs ran ahead of
		// the responder's would show out_of_seq_request climbing there
		// (CI once failed a SEND with RETRY_EXC_ERR here, not reproduced).
		return out + fmt.Sprintf("; responder counters %v", nb.dev.Counters())
	}
	for completed < total || !allRecvsDone(qps) {
		// Post while windows have room.
		for _, q := range qps {
			for posted < total && len(q.pending) < ftWindow {
				q.postOne(t, rng, na, nb)
				posted++
			}
		}
		progress := false
		n := na.scq.Poll(wcs)
		for _, wc := range wcs[:n] {
			q := byNumA[wc.QPNum]
			require.NotNil(t, q, "completion for unknown QP %#x", wc.QPNum)
			q.complete(t, na, wc)
			completed++
			progress = true
		}
		n = nb.rcq.Poll(wcs)
		for _, wc := range wcs[:n] {
			q := byNumB[wc.QPNum]
			require.NotNil(t, q)
			q.received(t, nb, wc)
			q.postRecv(t, nb)
			progress = true
		}
		if progress {
			lastProgress = time.Now()
			continue
		}
		if time.Since(lastProgress) > 30*time.Second {
			t.Fatalf("no progress for 30s: posted %d completed %d; A %v; B %v", posted, completed,
				na.dev.Counters(), nb.dev.Counters())
		}
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Millisecond)
		_ = na.scq.Wait(wctx)
		wcancel()
	}
	require.Equal(t, total, completed)
	for _, q := range qps {
		require.Empty(t, q.pending)
		require.Empty(t, q.recvs, "QP %d: receives never completed", q.idx)
		// A call into the responder's worker orders its memory writes
		// before our reads.
		_, _, err := q.b.Query()
		require.NoError(t, err)
		require.True(t, bytes.Equal(q.model, nb.buf[q.idx*ftArea:(q.idx+1)*ftArea]), "QP %d: remote memory differs from the model", q.idx)
		require.Equal(t, ib.QPSRTS, q.a.State())
		require.Equal(t, ib.QPSRTS, q.b.State())
	}
	noCompletion(t, na.scq)
	noCompletion(t, nb.rcq)
	ca, cb := na.dev.Counters(), nb.dev.Counters()
	t.Logf("%d ops over %d QPs; requester: sent %d, retries %d, timeouts %d, seq NAKs %d, drop_icrc+drop_ipv4_id %d; responder: dup %d, out-of-seq %d, drop_icrc+drop_ipv4_id %d, replays %d",
		total, nQP, ca["sent_pkts"], ca["completer_retry_err"], ca["retransmit_timeouts"], ca["rcvd_seq_err"], ca["drop_icrc"]+ca["drop_ipv4_id"],
		cb["duplicate_request"], cb["out_of_seq_request"], cb["drop_icrc"]+cb["drop_ipv4_id"], cb["replayed_responses"])
	if os.Getenv("RXED_FAULT_SPEC") != "" {
		return
	}
	// The faults really happened.
	require.NotZero(t, ca["drop_icrc"]+cb["drop_icrc"])
	require.NotZero(t, cb["duplicate_request"])
	require.NotZero(t, cb["out_of_seq_request"])
	require.Zero(t, ca["retry_exceeded_err"])
}

var connStats = func() string { return "" }

// ftTimeout is the QPs' local ACK timeout: 268 ms (16) for the short
// default run, which must not fail on a loaded machine or under the race
// detector, and 16.8 ms (12) for the long run, which spends its time in
// retransmit timeouts. 67 ms (14, perftest's default) was not enough: with
// six copies of the test in parallel (about CI's load) one run in two
// failed a WR with RETRY_EXC_ERR, at this build and at older ones alike
// (the engines starved, their timers expired, the resends overflowed the
// in-memory network's queues, and seven expiries came in a row).
func ftTimeout(total int) uint8 {
	if total > 10000 {
		return 12
	}
	return 16
}

func allRecvsDone(qps []*ftQP) bool {
	for _, q := range qps {
		if len(q.recvs) > 0 {
			return false
		}
	}
	return true
}

func (q *ftQP) postRecv(t *testing.T, nb *node) {
	slot := int(q.recvNext % ftRecvs)
	off := ftRecvBase + (q.idx*ftRecvs+slot)*ftRecvSlot
	require.NoError(t, q.b.PostRecv(ib.RecvWR{ID: q.recvNext, SGL: []ib.SGE{sge(nb, off, ftRecvSlot)}}))
	q.recvNext++
}

// postOne posts a random operation and records its expected outcome,
// applying it to the model in posting order (the responder executes a
// QP's requests in PSN order).
func (q *ftQP) postOne(t *testing.T, rng *rand.Rand, na, nb *node) {
	id := uint64(q.posted)
	slot := q.posted % ftSlots
	q.posted++
	loff := ftSlotsBase + (q.idx*ftSlots+slot)*ftSlot
	local := na.buf[loff : loff+ftSlot]
	remoteBase := nb.mr.IOVA() + uint64(q.idx*ftArea)
	length := 1 + rng.IntN(ftMaxLen)
	if rng.IntN(8) == 0 {
		length = rng.IntN(64)
	}
	off := ftCounters*8 + rng.IntN(ftArea-ftCounters*8-length)
	op := ftOp{id: id, slot: slot, length: length}
	wr := ib.SendWR{ID: id, Flags: ib.SendSignaled, SGL: []ib.SGE{sge(na, loff, length)},
		RemoteAddr: remoteBase + uint64(off), RKey: nb.mr.RKey()}
	k := rng.IntN(7)
	if k <= 1 {
		// A READ that is retried re-reads the responder's memory (IBA
		// o9-20, as rxe), so a WRITE may not overlap a READ still in
		// flight or the READ could legitimately return the newer bytes.
		for try := 0; q.overlapsRead(off, length); try++ {
			if try == 20 {
				k = 3 // give up: make it a SEND
				break
			}
			off = ftCounters*8 + rng.IntN(ftArea-ftCounters*8-length)
		}
		wr.RemoteAddr = remoteBase + uint64(off)
	}
	switch k {
	case 0, 1: // WRITE, WRITE_WITH_IMM
		fill(local[:length], int(id)*31+q.idx)
		copy(q.model[off:], local[:length])
		wr.Opcode = ib.WRRDMAWrite
		if k == 1 {
			wr.Opcode = ib.WRRDMAWriteWithImm
			wr.Imm = uint32(id)
			q.recvs = append(q.recvs, ftExpectRecv{op: ib.WCRecvRDMAWithImm, n: length, imm: uint32(id), hasI: true})
		}
	case 2: // READ
		clear(local[:length])
		wr.Opcode = ib.WRRDMARead
		op.want = append([]byte(nil), q.model[off:off+length]...)
		op.off = off
	case 3, 4: // SEND, SEND_WITH_IMM
		fill(local[:length], int(id)*17+q.idx)
		wr.Opcode = ib.WRSend
		e := ftExpectRecv{op: ib.WCRecv, data: append([]byte(nil), local[:length]...), n: length}
		if k == 4 {
			wr.Opcode = ib.WRSendWithImm
			wr.Imm = uint32(id) ^ 0xABCD0000
			e.imm, e.hasI = wr.Imm, true
		}
		q.recvs = append(q.recvs, e)
	case 5, 6: // CMP_SWP, FETCH_ADD on a counter
		c := rng.IntN(ftCounters)
		cur := binary.NativeEndian.Uint64(q.model[c*8:])
		wr.RemoteAddr = remoteBase + uint64(c*8)
		wr.SGL = []ib.SGE{sge(na, loff, 8)}
		op.length = 8
		op.want = binary.NativeEndian.AppendUint64(nil, cur)
		if k == 5 {
			wr.Opcode = ib.WRAtomicCmpAndSwp
			wr.CompareAdd = cur
			if rng.IntN(3) == 0 {
				wr.CompareAdd = cur + 1 // a compare that fails
			}
			wr.Swap = rng.Uint64()
			if wr.CompareAdd == cur {
				binary.NativeEndian.PutUint64(q.model[c*8:], wr.Swap)
			}
		} else {
			wr.Opcode = ib.WRAtomicFetchAndAdd
			wr.CompareAdd = uint64(rng.IntN(1000) + 1)
			binary.NativeEndian.PutUint64(q.model[c*8:], cur+wr.CompareAdd)
		}
	}
	op.op = wr.Opcode
	q.pending = append(q.pending, op)
	require.NoError(t, q.a.PostSend(wr))
}

func (q *ftQP) overlapsRead(off, n int) bool {
	for _, p := range q.pending {
		if p.op == ib.WRRDMARead && off < p.off+p.length && p.off < off+n {
			return true
		}
	}
	return false
}

func (q *ftQP) complete(t *testing.T, na *node, wc ib.WC) {
	require.Equal(t, ib.WCSuccess.String(), wc.Status.String(), "QP %d wr %d (pending %+v); requester counters %v; conns %s",
		q.idx, wc.ID, q.pending[0].op, na.dev.Counters(), connStats())
	require.NotEmpty(t, q.pending, "QP %d: unexpected completion %d", q.idx, wc.ID)
	op := q.pending[0]
	q.pending = q.pending[1:]
	require.Equal(t, op.id, wc.ID, "QP %d: completions out of order", q.idx)
	wantOp, _ := op.op.WCOpcode()
	require.Equal(t, wantOp, wc.Opcode)
	loff := ftSlotsBase + (q.idx*ftSlots+op.slot)*ftSlot
	local := na.buf[loff : loff+ftSlot]
	if op.want != nil {
		require.True(t, bytes.Equal(op.want, local[:len(op.want)]), "QP %d wr %d (%v): got %x want %x", q.idx, op.id, op.op,
			head(local[:len(op.want)]), head(op.want))
	}
	q.done++
}

func (q *ftQP) received(t *testing.T, nb *node, wc ib.WC) {
	require.Equal(t, ib.WCSuccess.String(), wc.Status.String())
	require.NotEmpty(t, q.recvs, "QP %d: receive completion nobody sent", q.idx)
	e := q.recvs[0]
	q.recvs = q.recvs[1:]
	require.Equal(t, e.op, wc.Opcode, "QP %d", q.idx)
	require.Equal(t, uint32(e.n), wc.ByteLen)
	require.Equal(t, e.hasI, wc.Flags&ib.WCWithImm != 0)
	if e.hasI {
		require.Equal(t, e.imm, wc.Imm)
	}
	if e.data != nil {
		slot := int(wc.ID % ftRecvs)
		off := ftRecvBase + (q.idx*ftRecvs+slot)*ftRecvSlot
		require.True(t, bytes.Equal(e.data, nb.buf[off:off+e.n]), "QP %d: SEND payload differs", q.idx)
	}
	q.recvDone++
}

func head(b []byte) string {
	if len(b) > 16 {
		b = b[:16]
	}
	return fmt.Sprintf("%x", b)
}
