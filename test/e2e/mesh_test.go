package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/mr"
	"github.com/stretchr/testify/require"
)

// TestMesh runs every ordered pair of N engines (N = 2, 4, 8) at once, in
// memory and over loopback UDP (each engine on its own 127.0.1.x): an RC
// and a UC QP pair per ordered pair and one UD QP per engine. Every pair
// runs its script concurrently with all others: WRITE gathered from three
// SGEs followed by a fenced READ of the same bytes, SEND (inline when it
// fits), SEND_WITH_IMM, RDMA WRITE_WITH_IMM, SEND_WITH_INV of a window
// bound by the responder, CMP_SWP, FETCH_ADD (every engine adds to one
// counter on engine 0), FLUSH, ATOMIC_WRITE, at path MTUs rotated over the pairs
// and sizes 0, 1, MTU-1, MTU, MTU+1 and 64 KiB; engine 0's RC QPs share
// one SRQ; every engine sends UD datagrams to every other; one extra pair
// moves 16 MiB with a WRITE and a READ. Every byte is compared with the
// model the test computed, and every completion's fields are checked.
// meshTimeout is the mesh QPs' local ACK timeout: 4.096 us x 2^16 = 268 ms.
const meshTimeout = 16

func TestMesh(t *testing.T) {
	for _, tr := range []struct {
		name string
		udp  bool
	}{{"mem", false}, {"udp", true}} {
		for _, n := range []int{2, 4, 8} {
			t.Run(fmt.Sprintf("%s/N=%d", tr.name, n), func(t *testing.T) {
				runMesh(t, n, tr.udp)
			})
		}
	}
}

var meshMTUs = []ib.MTU{ib.MTU256, ib.MTU512, ib.MTU1024, ib.MTU2048, ib.MTU4096}

const (
	meshMaxMsg   = 64 << 10
	meshBig      = 16 << 20
	meshFetchAdd = 8 // FETCH_ADDs per engine on engine 0's shared counter
	meshQKey     = 0x11111111
)

var meshUDSizes = []int{0, 1, 1000, 4096}

type meshOp int

const (
	opWriteRead meshOp = iota // RC: WRITE from 3 SGEs, then a fenced READ of the same bytes
	opWriteSend               // UC: WRITE from 3 SGEs, then a SEND that shows it arrived
	opSend                    // SEND, inline when it fits
	opSendImm                 // SEND_WITH_IMM from 3 SGEs
	opWriteImm                // WRITE_WITH_IMM from 3 SGEs
	opSendInv                 // RC: WRITE through a window, then SEND_WITH_INV of it
	opAtomics                 // RC: CMP_SWP, FETCH_ADD, FLUSH, ATOMIC_WRITE
)

type meshStep struct {
	op   meshOp
	size int
}

// recvSlot is where one posted receive scatters to.
type recvSlot struct{ off, cap int }

// meshPair is one connected QP pair from requester a to responder b.
type meshPair struct {
	name    string
	rc      bool
	a, b    *meshQP
	mtu     ib.MTU
	steps   []meshStep
	slots   map[uint64]recvSlot // b's receives (b's SRQ's when it has one)
	srcOff  int                 // on a: gather area
	sinkOff int                 // on a: READ sink and atomic results
	tgt     []int               // on b: each step's WRITE target
	tgtOff  int                 // the current step's
	winOff  int                 // on b: window area
	cellOff int                 // on b: CMP_SWP cell, then ATOMIC_WRITE cell
	mwKey   uint32
	srq     bool // b takes its receives from engine 0's SRQ
	seed    int
	origs   []uint64 // FETCH_ADD results on the shared counter
}

func runMesh(t *testing.T, n int, udp bool) {
	start := time.Now()
	sizesFor := func(mtu ib.MTU, pairIdx int) []int {
		m := mtu.Bytes()
		all := []int{0, 1, m - 1, m, m + 1, meshMaxMsg}
		if n < 8 {
			return all
		}
		// With 56 ordered pairs each runs two sizes; the rotation still
		// puts every size on some pair of every MTU.
		return []int{all[(2*pairIdx)%6], all[(2*pairIdx+1)%6]}
	}
	var tally opcodeTally
	nodes := openMeshNodes(t, n, udp, func(i int) int {
		s := (n-1)*(1<<20) + 4<<20
		if i <= 1 {
			s += meshBig
		}
		return s
	}, &tally)

	// Engine 0's RC QPs take their receives from one SRQ.
	srq, err := nodes[0].pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 4096, MaxSGE: 1})
	require.NoError(t, err)
	srqSlots := map[uint64]recvSlot{}

	// Shared FETCH_ADD counter on engine 0.
	sharedOff := nodes[0].take(8)
	const sharedInit = 1_000_000
	binary.NativeEndian.PutUint64(nodes[0].buf[sharedOff:], sharedInit)

	var pairs []*meshPair
	pairIdx := 0
	for i := range nodes {
		for j := range nodes {
			if i == j {
				continue
			}
			for _, rc := range []bool{true, false} {
				na, nb := nodes[i], nodes[j]
				typ, kind := ib.UC, "uc"
				var bsrq *ib.SRQ
				mtu := meshMTUs[(pairIdx+2)%len(meshMTUs)]
				if rc {
					typ, kind = ib.RC, "rc"
					mtu = meshMTUs[pairIdx%len(meshMTUs)]
					if j == 0 {
						bsrq = srq
					}
				}
				p := &meshPair{name: fmt.Sprintf("%s %d->%d %v", kind, i, j, mtu), rc: rc, mtu: mtu,
					a: na.createMeshQP(typ, nil), b: nb.createMeshQP(typ, bsrq), seed: 1000 * (pairIdx + 1)}
				// Up to 113 QP pairs of 8 engines on 2 CPUs (under -race) can
				// keep a response waiting past perftest's 67 ms timeout;
				// 268 ms (16) keeps such spurious retransmissions from
				// exhausting retry_cnt. The mesh loses nothing itself.
				o := qpOpts{typ: typ, mtu: mtu, rnrRetry: 7, timeout: meshTimeout}
				connectQPs(t, na.node, p.a.qp, nb.node, p.b.qp, o)
				for _, s := range sizesFor(mtu, pairIdx/2) {
					if rc {
						p.steps = append(p.steps, meshStep{opWriteRead, s})
					} else {
						p.steps = append(p.steps, meshStep{opWriteSend, s})
					}
					p.steps = append(p.steps, meshStep{opSend, s}, meshStep{opSendImm, s}, meshStep{opWriteImm, s})
				}
				if rc {
					// SEND_FIRST … SEND_LAST_INV on every other RC pair,
					// SEND_ONLY_INV on the rest.
					inv := 16
					if pairIdx%4 == 0 {
						inv = 2*mtu.Bytes() + 1
					}
					p.steps = append(p.steps, meshStep{opSendInv, inv}, meshStep{opAtomics, 0})
				}
				p.srcOff = na.take(meshMaxMsg + 64)
				p.sinkOff = na.take(meshMaxMsg + 8*(meshFetchAdd+8))
				// Every step writes to fresh memory: over real sockets the
				// race detector cannot see that a later WRITE follows our
				// check of an earlier one (the edge runs through the kernel).
				p.tgt = make([]int, len(p.steps))
				for k, s := range p.steps {
					switch s.op {
					case opWriteRead, opWriteSend, opWriteImm:
						p.tgt[k] = nb.take(s.size)
					}
				}
				p.cellOff = nb.take(16)
				binary.NativeEndian.PutUint64(nb.buf[p.cellOff:], uint64(p.seed))
				if rc {
					p.winOff = nb.take(4096)
					mw, err := nb.pd.AllocMW(ib.MWType2)
					require.NoError(t, err)
					p.mwKey = mr.IncKey(mw.RKey())
					require.NoError(t, p.b.qp.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRBindMW, Flags: ib.SendSignaled,
						Bind: ib.MWBindInfo{MWRKey: mw.RKey(), NewRKey: p.mwKey, MRLKey: nb.xmr.LKey(),
							Addr: nb.xmr.IOVA() + uint64(p.winOff), Length: 4096, Access: ib.AccessRemoteWrite}}))
					waitOK(t, p.b.scq, 1, ib.WCBindMW)
				}
				// Receives, in the order the script consumes them.
				p.slots = map[uint64]recvSlot{}
				for k, s := range p.steps {
					if s.op == opWriteRead || s.op == opAtomics {
						continue
					}
					id := uint64(pairIdx)<<32 | uint64(k)
					if bsrq != nil {
						// Any QP may take any SRQ receive: room for the largest.
						slot := recvSlot{nb.take(meshMaxMsg), meshMaxMsg}
						srqSlots[id] = slot
						require.NoError(t, srq.PostRecv(ib.RecvWR{ID: id, SGL: []ib.SGE{sge(nb.node, slot.off, slot.cap)}}))
						continue
					}
					slot := recvSlot{nb.take(s.size), s.size}
					p.slots[id] = slot
					var sgl []ib.SGE
					if s.op != opWriteImm && s.size > 0 {
						sgl = []ib.SGE{sge(nb.node, slot.off, slot.cap)}
					}
					require.NoError(t, p.b.qp.PostRecv(ib.RecvWR{ID: id, SGL: sgl}))
				}
				if bsrq != nil {
					p.slots, p.srq = srqSlots, true
				}
				pairs = append(pairs, p)
				pairIdx++
			}
		}
	}

	// One UD QP per engine.
	ud := make([]*meshQP, n)
	udSrc := make([]int, n)
	udRecv := make([]int, n)
	for i, nd := range nodes {
		q := nd.createMeshQP(ib.UD, nil)
		require.NoError(t, q.qp.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, QKey: meshQKey},
			ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrQKey))
		require.NoError(t, q.qp.Modify(&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState))
		require.NoError(t, q.qp.Modify(&ib.QPAttr{State: ib.QPSRTS, SQPSN: 3}, ib.AttrState|ib.AttrSQPSN))
		ud[i] = q
		udSrc[i] = nd.take(4096)
		cnt := (n - 1) * len(meshUDSizes)
		udRecv[i] = nd.take(cnt * (40 + 4096))
		for k := 0; k < cnt; k++ {
			require.NoError(t, q.qp.PostRecv(ib.RecvWR{ID: uint64(k), SGL: []ib.SGE{sge(nd.node, udRecv[i]+k*(40+4096), 40+4096)}}))
		}
	}

	// The 16 MiB pair: engine 0 to engine 1 at MTU 4096.
	bigA, bigB := nodes[0].createMeshQP(ib.RC, nil), nodes[1].createMeshQP(ib.RC, nil)
	connectQPs(t, nodes[0].node, bigA.qp, nodes[1].node, bigB.qp, qpOpts{mtu: ib.MTU4096, timeout: meshTimeout})
	bigSrc, bigTgt := nodes[0].take(meshBig), nodes[1].take(meshBig)
	setup := time.Since(start)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	var slowest time.Duration
	var slowestName string
	run := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			err := f()
			mu.Lock()
			if d := time.Since(t0); d > slowest {
				slowest, slowestName = d, name
			}
			mu.Unlock()
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				mu.Unlock()
				cancel() // the others stop at their next wait
			}
		}()
	}
	for _, p := range pairs {
		run(p.name, func() error { return p.run(ctx, nodes[0], sharedOff) })
	}
	for i := range nodes {
		run(fmt.Sprintf("ud send %d", i), func() error { return meshUDSend(ctx, nodes, ud, i, udSrc[i]) })
		run(fmt.Sprintf("ud recv %d", i), func() error { return meshUDRecv(ctx, nodes, ud, i, udRecv[i]) })
	}
	run("16 MiB", func() error { return meshBigTransfer(ctx, nodes[0], nodes[1], bigA, bigB, bigSrc, bigTgt) })
	wg.Wait()
	// The first failure cancels the rest; report the failures that are
	// not just that.
	var root []error
	for _, err := range errs {
		if !errors.Is(err, context.Canceled) {
			root = append(root, err)
		}
	}
	if len(root) > 0 {
		// What the engines saw explains most failures (drops by reason,
		// retries): log the counters that moved.
		for i, n := range nodes {
			moved := map[string]uint64{}
			for k, v := range n.dev.Counters() {
				if v != 0 {
					moved[k] = v
				}
			}
			t.Logf("node %d counters: %v", i, moved)
		}
	}
	require.Empty(t, root)
	require.Empty(t, errs)

	// The shared counter: every engine's adds, exactly once each.
	for _, p := range pairs {
		if p.rc && p.b.n.idx == 0 {
			_, _, err := p.b.qp.Query() // orders the responder's writes before our read
			require.NoError(t, err)
		}
	}
	want := uint64(sharedInit)
	var origs []uint64
	for _, p := range pairs {
		origs = append(origs, p.origs...)
		if p.rc && p.b.n.idx == 0 {
			want += meshFetchAdd * uint64(p.a.n.idx)
		}
	}
	require.Equal(t, want, binary.NativeEndian.Uint64(nodes[0].buf[sharedOff:]))
	require.Len(t, origs, (n-1)*meshFetchAdd)
	sort.Slice(origs, func(i, j int) bool { return origs[i] < origs[j] })
	for k := 1; k < len(origs); k++ {
		require.Less(t, origs[k-1], origs[k], "two FETCH_ADDs saw the same value")
	}
	require.Equal(t, uint64(sharedInit), origs[0])
	for _, op := range meshOpcodes() {
		require.NotZero(t, tally[op].Load(), "no %v sent", op)
	}
	// Loopback UDP may drop a burst (the 16 MiB READ's responses exceed
	// the socket buffer) and a loaded machine may fire a retransmit timer
	// early, so retransmissions are logged, not forbidden; the in-memory
	// network never loses or reorders, so nothing is ever out of sequence.
	var retransmits uint64
	for _, nd := range nodes {
		c := nd.dev.Counters()
		require.Zero(t, c["drop_icrc"], "engine %d", nd.idx)
		require.Zero(t, c["retry_exceeded_err"]+c["retry_rnr_exceeded_err"], "engine %d", nd.idx)
		if !udp {
			require.Zero(t, c["out_of_seq_request"], "engine %d", nd.idx)
		}
		retransmits += c["completer_retry_err"]
	}
	t.Logf("N=%d udp=%v: %d QP pairs, %d UD QPs, setup %v, traffic %v, %d retransmit timeouts, slowest %q %v", n, udp, len(pairs)+1, n,
		setup.Round(time.Millisecond), (time.Since(start) - setup).Round(time.Millisecond), retransmits, slowestName, slowest.Round(time.Millisecond))
}

// run executes the pair's script, one message at a time, checking both
// ends of every step.
func (p *meshPair) run(ctx context.Context, n0 *meshNode, sharedOff int) error {
	a, b := p.a.n, p.b.n
	remote := func(off int) uint64 { return b.mr.IOVA() + uint64(off) }
	// syncB makes the responder's memory writes visible to this goroutine
	// (a call into the responder QP's worker), for the race detector.
	syncB := func() error { _, _, err := p.b.qp.Query(); return err }
	for k, s := range p.steps {
		id := uint64(k + 1)
		p.tgtOff = p.tgt[k]
		recvID := uint64(0)
		if s.op != opWriteRead && s.op != opAtomics {
			recvID = uint64(p.recvBase())<<32 | uint64(k)
		}
		fill(a.buf[p.srcOff:p.srcOff+max(s.size+16, 1024)], p.seed+k)
		sgl, want := a.splitSGL(p.srcOff, s.size)
		what := fmt.Sprintf("step %d (op %d, %d bytes)", k, s.op, s.size)
		var err error
		switch s.op {
		case opWriteRead:
			sink := a.buf[p.sinkOff : p.sinkOff+s.size]
			fill(sink, ^(p.seed + k))
			err = p.a.qp.PostSend(
				ib.SendWR{ID: id, Opcode: ib.WRRDMAWrite, SGL: sgl, RemoteAddr: remote(p.tgtOff), RKey: b.mr.RKey()},
				ib.SendWR{ID: id + 1000, Opcode: ib.WRRDMARead, Flags: ib.SendSignaled | ib.SendFence,
					SGL: []ib.SGE{sge(a.node, p.sinkOff, s.size)}, RemoteAddr: remote(p.tgtOff), RKey: b.mr.RKey()})
			if err == nil {
				var wc ib.WC
				if wc, err = meshExpect(ctx, p.a.scq, id+1000, ib.WCRDMARead); err == nil && wc.ByteLen != uint32(s.size) {
					err = fmt.Errorf("READ byte_len %d", wc.ByteLen)
				}
			}
			if err == nil {
				err = sameBytes("fenced READ after WRITE", sink, want)
			}
			if err == nil {
				if err = syncB(); err == nil {
					err = sameBytes("WRITE target", b.buf[p.tgtOff:p.tgtOff+s.size], want)
				}
			}
		case opWriteSend, opSend, opSendImm, opWriteImm, opSendInv:
			err = p.message(ctx, s, id, recvID, sgl, want)
		case opAtomics:
			err = p.atomics(ctx, n0, sharedOff)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	return nil
}

// recvBase is the pair's index in the receive IDs (the seed encodes it).
func (p *meshPair) recvBase() int { return p.seed/1000 - 1 }

// message runs one receive-consuming step and checks the sender's and
// the receiver's completion and the received bytes.
func (p *meshPair) message(ctx context.Context, s meshStep, id, recvID uint64, sgl []ib.SGE, want []byte) error {
	a, b := p.a.n, p.b.n
	imm := uint32(p.seed)<<8 | uint32(id)
	wr := ib.SendWR{ID: id, Flags: ib.SendSignaled, SGL: sgl}
	var wrs []ib.SendWR
	wantOp, wantFlags := ib.WCRecv, ib.WCFlags(0)
	var wantTarget []byte
	switch s.op {
	case opWriteSend, opSend:
		wr.Opcode = ib.WRSend
		if s.size <= 256 {
			// Inline: the bytes are copied at post time, from
			// anywhere; clobbering the source afterwards proves it.
			wr.Flags |= ib.SendInline
			wr.Inline, wr.SGL = append([]byte(nil), want...), nil
		}
		if s.op == opWriteSend {
			// UC has no ACKs: the SEND behind the WRITE shows the WRITE
			// was placed before it.
			wantTarget = want
			wrs = append(wrs, ib.SendWR{ID: id + 1000, Opcode: ib.WRRDMAWrite, SGL: sgl,
				RemoteAddr: b.mr.IOVA() + uint64(p.tgtOff), RKey: b.mr.RKey()})
		}
	case opSendImm:
		wr.Opcode, wr.Imm = ib.WRSendWithImm, imm
		wantFlags = ib.WCWithImm
	case opWriteImm:
		wr.Opcode, wr.Imm = ib.WRRDMAWriteWithImm, imm
		wr.RemoteAddr, wr.RKey = b.mr.IOVA()+uint64(p.tgtOff), b.mr.RKey()
		wantOp, wantFlags, wantTarget = ib.WCRecvRDMAWithImm, ib.WCWithImm, want
	case opSendInv:
		// A WRITE through the window the responder bound, then the
		// SEND_WITH_INV that retires it.
		wantTarget = append([]byte(nil), a.buf[p.srcOff:p.srcOff+1000]...)
		wrs = append(wrs, ib.SendWR{ID: id + 1000, Opcode: ib.WRRDMAWrite, SGL: []ib.SGE{sge(a.node, p.srcOff, 1000)},
			RemoteAddr: b.xmr.IOVA() + uint64(p.winOff) + 100, RKey: p.mwKey})
		wr.Opcode, wr.InvalidateRKey = ib.WRSendWithInv, p.mwKey
		wantFlags = ib.WCWithInv
	}
	if err := p.a.qp.PostSend(append(wrs, wr)...); err != nil {
		return err
	}
	if wr.Flags&ib.SendInline != 0 {
		clear(wr.Inline)
	}
	sendOp := ib.WCSend
	if s.op == opWriteImm {
		sendOp = ib.WCRDMAWrite
	}
	if _, err := meshExpect(ctx, p.a.scq, id, sendOp); err != nil {
		return err
	}
	if p.srq {
		recvID = anyID // the SRQ hands out whichever receive is next
	}
	rwc, err := meshExpect(ctx, p.b.rcq, recvID, wantOp)
	if err != nil {
		return fmt.Errorf("receiver: %w", err)
	}
	switch {
	case rwc.ByteLen != uint32(s.size):
		return fmt.Errorf("receive byte_len %d, want %d", rwc.ByteLen, s.size)
	case rwc.QPNum != p.b.qp.Num():
		return fmt.Errorf("receive on QP %#x, want %#x", rwc.QPNum, p.b.qp.Num())
	case rwc.Flags&(ib.WCWithImm|ib.WCWithInv) != wantFlags:
		return fmt.Errorf("receive flags %v, want %v", rwc.Flags, wantFlags)
	case wantFlags == ib.WCWithImm && rwc.Imm != imm:
		return fmt.Errorf("imm %#x, want %#x", rwc.Imm, imm)
	case wantFlags == ib.WCWithInv && rwc.InvalidatedRKey != p.mwKey:
		return fmt.Errorf("invalidated rkey %#x, want %#x", rwc.InvalidatedRKey, p.mwKey)
	}
	if _, _, err := p.b.qp.Query(); err != nil {
		return err
	}
	if s.op != opWriteImm {
		slot, ok := p.slots[rwc.ID]
		if !ok {
			return fmt.Errorf("receive wr %d has no slot", rwc.ID)
		}
		if err := sameBytes("received", b.buf[slot.off:slot.off+s.size], want); err != nil {
			return err
		}
	}
	switch s.op {
	case opSendInv:
		return sameBytes("WRITE through window", b.buf[p.winOff+100:p.winOff+1100], wantTarget)
	case opWriteSend, opWriteImm:
		return sameBytes("WRITE target", b.buf[p.tgtOff:p.tgtOff+s.size], wantTarget)
	}
	return nil
}

// atomics runs CMP_SWP (three that succeed, one that fails), FETCH_ADD
// (on engine 0's shared counter when b is engine 0, else on the pair's
// cell) and ATOMIC_WRITE, checking every original value returned.
func (p *meshPair) atomics(ctx context.Context, n0 *meshNode, sharedOff int) error {
	a, b := p.a.n, p.b.n
	res := func(k int) int { return p.sinkOff + 8*k }
	cell := b.mr.IOVA() + uint64(p.cellOff)
	id := uint64(5000)
	post := func(wr ib.SendWR, op ib.WCOpcode) error {
		id++
		wr.ID, wr.Flags = id, ib.SendSignaled
		if err := p.a.qp.PostSend(wr); err != nil {
			return err
		}
		_, err := meshExpect(ctx, p.a.scq, id, op)
		return err
	}
	v := uint64(p.seed)
	for k, cmp := range []uint64{v, v*3 + 1, (v*3+1)*3 + 1, 1} { // the last compare fails
		swap := cmp*3 + 1
		if err := post(ib.SendWR{Opcode: ib.WRAtomicCmpAndSwp, CompareAdd: cmp, Swap: swap,
			SGL: []ib.SGE{sge(a.node, res(k), 8)}, RemoteAddr: cell, RKey: b.mr.RKey()}, ib.WCCompSwap); err != nil {
			return err
		}
		if got := binary.NativeEndian.Uint64(a.buf[res(k):]); got != v {
			return fmt.Errorf("CMP_SWP %d returned %d, want %d", k, got, v)
		}
		if cmp == v {
			v = swap
		}
	}
	if b == n0 {
		for k := 0; k < meshFetchAdd; k++ {
			if err := post(ib.SendWR{Opcode: ib.WRAtomicFetchAndAdd, CompareAdd: uint64(a.idx),
				SGL: []ib.SGE{sge(a.node, res(8+k), 8)}, RemoteAddr: n0.mr.IOVA() + uint64(sharedOff), RKey: n0.mr.RKey()}, ib.WCFetchAdd); err != nil {
				return err
			}
			p.origs = append(p.origs, binary.NativeEndian.Uint64(a.buf[res(8+k):]))
		}
	} else {
		if err := post(ib.SendWR{Opcode: ib.WRAtomicFetchAndAdd, CompareAdd: 5,
			SGL: []ib.SGE{sge(a.node, res(8), 8)}, RemoteAddr: cell, RKey: b.mr.RKey()}, ib.WCFetchAdd); err != nil {
			return err
		}
		if got := binary.NativeEndian.Uint64(a.buf[res(8):]); got != v {
			return fmt.Errorf("FETCH_ADD returned %d, want %d", got, v)
		}
		v += 5
	}
	// FLUSH (global visibility) of the cells, through the region that
	// allows it.
	if err := post(ib.SendWR{Opcode: ib.WRFlush, RemoteAddr: b.xmr.IOVA() + uint64(p.cellOff), RKey: b.xmr.RKey(),
		CompareAdd: 1}, ib.WCFlush); err != nil {
		return err
	}
	aw := uint64(p.seed)*0x9E3779B97F4A7C15 | 1
	binary.NativeEndian.PutUint64(a.buf[res(7):], aw)
	if err := post(ib.SendWR{Opcode: ib.WRAtomicWrite, SGL: []ib.SGE{sge(a.node, res(7), 8)},
		RemoteAddr: cell + 8, RKey: b.mr.RKey()}, ib.WCAtomicWrite); err != nil {
		return err
	}
	if _, _, err := p.b.qp.Query(); err != nil {
		return err
	}
	if got := binary.NativeEndian.Uint64(b.buf[p.cellOff:]); got != v {
		return fmt.Errorf("CMP_SWP/FETCH_ADD cell %d, want %d", got, v)
	}
	if got := binary.NativeEndian.Uint64(b.buf[p.cellOff+8:]); got != aw {
		return fmt.Errorf("ATOMIC_WRITE cell %#x, want %#x", got, aw)
	}
	return nil
}

func meshUDSeed(src, dst, m int) int { return 7_000_000 + src<<16 | dst<<8 | m }

// meshUDSend sends len(meshUDSizes) datagrams from engine i's UD QP to
// every other engine's, every other one with immediate data.
func meshUDSend(ctx context.Context, nodes []*meshNode, ud []*meshQP, i, src int) error {
	nd := nodes[i]
	for j, peer := range nodes {
		if j == i {
			continue
		}
		ah, err := nd.pd.CreateAH(ib.AHAttr{DGID: peer.addr, DestPort: peer.dev.UDPPort(), PortNum: 1})
		if err != nil {
			return err
		}
		for m, size := range meshUDSizes {
			fill(nd.buf[src:src+size], meshUDSeed(i, j, m))
			id := uint64(j<<8 | m)
			wr := ib.SendWR{ID: id, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: []ib.SGE{sge(nd.node, src, size)}}
			if m%2 == 1 {
				wr.Opcode, wr.Imm = ib.WRSendWithImm, uint32(meshUDSeed(i, j, m))
			}
			ib.UDSend(&wr, ah, ud[j].qp.Num(), meshQKey)
			if err := ud[i].qp.PostSend(wr); err != nil {
				return err
			}
			if _, err := meshExpect(ctx, ud[i].scq, id, ib.WCSend); err != nil {
				return err
			}
		}
	}
	return nil
}

// meshUDRecv checks every datagram engine j receives: the source QP in
// the completion names the sender, the GRH carries the sender's and our
// address, the bytes and immediate data are what the sender sent, in the
// order it sent them.
func meshUDRecv(ctx context.Context, nodes []*meshNode, ud []*meshQP, j, recvOff int) error {
	nd := nodes[j]
	next := make([]int, len(nodes))
	want := make([]byte, 4096)
	for range (len(nodes) - 1) * len(meshUDSizes) {
		wc, err := meshExpect(ctx, ud[j].rcq, anyID, ib.WCRecv)
		if err != nil {
			return err
		}
		// QPNs are per device: the GRH's source address names the
		// sender, whose UD QPN the completion must carry.
		slot := nd.buf[recvOff+int(wc.ID)*(40+4096):]
		grh := slot[:40]
		src := -1
		for i, peer := range nodes {
			if i != j && [4]byte(grh[32:36]) == peer.addr.As4() {
				src = i
			}
		}
		if src < 0 || [4]byte(grh[36:40]) != nd.addr.As4() {
			return fmt.Errorf("UD receive: GRH addresses %v", grh[32:40])
		}
		if wc.SrcQP != ud[src].qp.Num() {
			return fmt.Errorf("UD receive from engine %d: source QP %#x, want %#x", src, wc.SrcQP, ud[src].qp.Num())
		}
		m := next[src]
		next[src]++
		if m >= len(meshUDSizes) {
			return fmt.Errorf("UD: too many datagrams from engine %d", src)
		}
		size := meshUDSizes[m]
		if wc.ByteLen != uint32(40+size) || wc.Flags&ib.WCWithGRH == 0 || wc.QPNum != ud[j].qp.Num() {
			return fmt.Errorf("UD receive %d from %d: byte_len %d flags %v qp %#x", m, src, wc.ByteLen, wc.Flags, wc.QPNum)
		}
		if hasImm := wc.Flags&ib.WCWithImm != 0; hasImm != (m%2 == 1) || (hasImm && wc.Imm != uint32(meshUDSeed(src, j, m))) {
			return fmt.Errorf("UD receive %d from %d: imm %#x flags %v", m, src, wc.Imm, wc.Flags)
		}
		fill(want[:size], meshUDSeed(src, j, m))
		if err := sameBytes(fmt.Sprintf("UD datagram %d from %d", m, src), slot[40:40+size], want[:size]); err != nil {
			return err
		}
	}
	return nil
}

// meshBigTransfer moves 16 MiB from engine a to engine b with one WRITE
// and brings it back with one READ.
func meshBigTransfer(ctx context.Context, a, b *meshNode, qa, qb *meshQP, srcOff, tgtOff int) error {
	src := a.buf[srcOff : srcOff+meshBig]
	fill(src, 16)
	want := append([]byte(nil), src...)
	if err := qa.qp.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{sge(a.node, srcOff, meshBig)}, RemoteAddr: b.mr.IOVA() + uint64(tgtOff), RKey: b.mr.RKey()}); err != nil {
		return err
	}
	if _, err := meshExpect(ctx, qa.scq, 1, ib.WCRDMAWrite); err != nil {
		return err
	}
	if _, _, err := qb.qp.Query(); err != nil {
		return err
	}
	if err := sameBytes("16 MiB WRITE target", b.buf[tgtOff:tgtOff+meshBig], want); err != nil {
		return err
	}
	clear(src)
	if err := qa.qp.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRRDMARead, Flags: ib.SendSignaled,
		SGL: []ib.SGE{sge(a.node, srcOff, meshBig)}, RemoteAddr: b.mr.IOVA() + uint64(tgtOff), RKey: b.mr.RKey()}); err != nil {
		return err
	}
	wc, err := meshExpect(ctx, qa.scq, 2, ib.WCRDMARead)
	if err != nil {
		return err
	}
	if wc.ByteLen != meshBig {
		return fmt.Errorf("16 MiB READ byte_len %d", wc.ByteLen)
	}
	return sameBytes("16 MiB READ", src, want)
}
