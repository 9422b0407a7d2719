package qp

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/stretchr/testify/require"
)

// A READ is answered a budget at a time (rxe's read_reply sends one
// response per task iteration and reschedules): Receive accepts it, Run
// sends at most budget responses and reports more until the last is out.

const paceBudget = 64

// paceFill gives n bytes of b a pattern that differs in every KiB.
func paceFill(b []byte) {
	for i := range b {
		b[i] = byte(i*7 + i>>10)
	}
}

// readRequest builds the READ request packet a peer would send.
func readRequest(t *testing.T, dst *end, psn PSN, va uint64, rkey, n uint32) []byte {
	t.Helper()
	h := wire.Headers{Opcode: wire.RCReadRequest, PKey: DefaultPKey, DestQP: dst.q.Num(), PSN: uint32(psn),
		AckReq: true, VA: va, RKey: rkey, DMALen: n}
	buf := make([]byte, MaxPacketLen)
	_, size, err := h.EncodeHeaders(buf, 0)
	require.NoError(t, err)
	return buf[:size]
}

// receiveOnly hands pkts to dst without running it, as the engine's
// receive path does before it calls Run.
func (l *link) receiveOnly(dst, src *end, pkts ...[]byte) {
	for _, raw := range pkts {
		var p wire.Packet
		require.NoError(l.t, p.Parse(raw))
		ri := RecvInfo{Src: src.addr, Dst: dst.addr}
		require.Equal(l.t, DropNone, dst.q.Check(&p, &ri, dst.addr.Addr()))
		dst.q.Receive(dst.env, &p, &ri, l.now)
	}
}

// pace runs e with budget until Run reports no more work and returns the
// packets of each call.
func (l *link) pace(e *end, budget int) (calls [][][]byte, lastMore bool) {
	for range 100000 {
		more := e.q.Run(e.env, l.now, budget)
		calls = append(calls, e.env.take())
		if !more {
			return calls, false
		}
	}
	return calls, true
}

// readResponses checks that pkts are one READ reply from psn: consecutive
// PSNs, FIRST (or, opening false, MIDDLE) … LAST, every payload full but
// the last, the bytes equal to want. It returns the MSN of the last.
func readResponses(t *testing.T, pkts [][]byte, psn PSN, opening bool, mtu int, want []byte) uint32 {
	t.Helper()
	require.Len(t, pkts, pktCount(len(want), mtu))
	var p wire.Packet
	off := 0
	for i, raw := range pkts {
		require.NoError(t, p.Parse(raw))
		require.Equal(t, psn.Add(uint32(i)), PSN(p.BTH.PSN()), "packet %d", i)
		first, last := i == 0, i == len(pkts)-1
		var op wire.Opcode
		switch {
		case first && last && opening:
			op = wire.RCReadResponseOnly
		case first && opening:
			op = wire.RCReadResponseFirst
		case last:
			op = wire.RCReadResponseLast
		default:
			op = wire.RCReadResponseMiddle
		}
		require.Equal(t, op, p.Opcode, "packet %d", i)
		if !last {
			require.Len(t, p.Payload, mtu, "packet %d", i)
		}
		require.Equal(t, want[off:off+len(p.Payload)], p.Payload, "packet %d", i)
		off += len(p.Payload)
	}
	require.Equal(t, len(want), off)
	return p.AETH.MSN()
}

// pacedRead gives a fresh MTU 1024 link's responder a READ of the first
// size bytes of its region, from PSN 0xFFFF00, and runs it once: the
// reply is under way, its first budget of responses (returned) sent.
func pacedRead(t *testing.T, size uint32) (l *link, psn PSN, va uint64, rkey uint32, first [][]byte) {
	t.Helper()
	l = newLinkMTU(t, MTU1024)
	paceFill(l.b.buf)
	psn = PSN(0xFFFF00)
	va, rkey = l.b.m.IOVA(), l.b.m.RKey()
	l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn, va, rkey, size))
	require.True(t, l.b.q.Run(l.b.env, l.now, paceBudget))
	first = l.b.env.take()
	require.Len(t, first, paceBudget)
	return l, psn, va, rkey, first
}

func flatten(calls [][][]byte) (all [][]byte) {
	for _, c := range calls {
		all = append(all, c...)
	}
	return all
}

// TestReadPacedByBudget: a 1 MiB READ at MTU 1024 is 1024
// responses, sent 64 per Run over exactly 16 calls, PSNs consecutive
// across the 24-bit wrap, FIRST, MIDDLE…, LAST, the bytes of the source;
// the requester completes it.
//
// Regression test: was TestRegressReadPacedByBudget in regress_readpace_test.go
// (added in commit de4611d).
func TestReadPacedByBudget(t *testing.T) {
	const size = 1 << 20
	l := newLinkMTU(t, MTU1024)
	paceFill(l.b.buf)
	l.post(SendWR{ID: 7, Opcode: WRRDMARead, Flags: Signaled, SGL: []SGE{l.a.sge(0, size)},
		RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()})
	req := l.a.env.take()
	require.Len(t, req, 1)
	l.receiveOnly(l.b, l.a, req...)
	require.Empty(t, l.b.env.take(), "Receive only accepts the READ")

	calls, _ := l.pace(l.b, paceBudget)
	require.Len(t, calls, size/1024/paceBudget)
	for i, c := range calls {
		require.Len(t, c, paceBudget, "call %d", i)
	}
	resp := flatten(calls)
	msn := readResponses(t, resp, PSN(wire.BTH(req[0]).PSN()), true, 1024, l.b.buf[:size])
	require.Equal(t, uint32(1), msn, "the READ counts in the MSN when accepted")
	require.Equal(t, uint64(size/1024), l.b.q.ctr.SentPkts.Load())

	l.deliver(l.a, l.b, resp...)
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, 1)
	require.Equal(t, WCSuccess, wcs[0].Status)
	require.Equal(t, uint32(size), wcs[0].ByteLen)
	require.Equal(t, l.b.buf[:size], l.a.buf[:size])
}

// TestReadPacedRunReportsMore: Run returns after its budget with
// more=true, so a worker can turn to another QP in between; two QPs'
// replies interleave a budget at a time, a smaller budget gives smaller
// turns, and a budget left over after the reply's end is not reported as
// more.
//
// Regression test: was TestRegressReadPacedRunReportsMore in regress_readpace_test.go
// (added in commit de4611d).
func TestReadPacedRunReportsMore(t *testing.T) {
	l1, l2 := newLinkMTU(t, MTU1024), newLinkMTU(t, MTU1024)
	const n1, n2 = 300 * 1024, 100*1024 + 17
	paceFill(l1.b.buf)
	paceFill(l2.b.buf)
	psn1 := PSN(0xFFFF00)
	l1.receiveOnly(l1.b, l1.a, readRequest(t, l1.b, psn1, l1.b.m.IOVA(), l1.b.m.RKey(), n1))
	l2.receiveOnly(l2.b, l2.a, readRequest(t, l2.b, psn1, l2.b.m.IOVA()+5, l2.b.m.RKey(), n2))

	// A worker's round robin: one budget each per round.
	type turn struct{ qp, pkts int }
	var trace []turn
	var got [2][][]byte
	budgets := [2]int{paceBudget, 10}
	ends := [2]*end{l1.b, l2.b}
	busy := [2]bool{true, true}
	for busy[0] || busy[1] {
		for i, e := range ends {
			if !busy[i] {
				continue
			}
			busy[i] = e.q.Run(e.env, l1.now, budgets[i])
			pk := e.env.take()
			require.LessOrEqual(t, len(pk), budgets[i])
			trace = append(trace, turn{i, len(pk)})
			got[i] = append(got[i], pk...)
		}
	}
	// 300 packets at 64 and 101 at 10: five turns of qp 0 (64*4+44) and
	// eleven of qp 1 (10*10+1), alternating while both have work.
	want := []turn{{0, 64}, {1, 10}, {0, 64}, {1, 10}, {0, 64}, {1, 10}, {0, 64}, {1, 10}, {0, 44}, {1, 10}}
	for range 5 {
		want = append(want, turn{1, 10})
	}
	want = append(want, turn{1, 1})
	require.Equal(t, want, trace)
	readResponses(t, got[0], psn1, true, 1024, l1.b.buf[:n1])
	readResponses(t, got[1], psn1, true, 1024, l2.b.buf[5:5+n2])
	require.False(t, l1.b.q.Run(l1.b.env, l1.now, paceBudget), "nothing left")
	require.Empty(t, l1.b.env.take())
}

// TestReadPacedDuplicateWaits: a READ retried from a middle PSN
// while its reply is still being sent waits for the reply to finish, as
// it waits in rxe's req_pkts queue, then is replayed MIDDLE … LAST; the
// two never interleave. A retry of the whole READ replays FIRST … LAST.
//
// Regression test: was TestRegressReadPacedDuplicateWaits in regress_readpace_test.go
// (added in commit de4611d).
func TestReadPacedDuplicateWaits(t *testing.T) {
	const size = 256 * 1024
	l, psn, va, rkey, first := pacedRead(t, size)

	// The requester lost response 40 and asks again from there.
	const from = 40
	l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn.Add(from), va+from*1024, rkey, size-from*1024))
	require.Empty(t, l.b.env.take(), "the retry waits behind the reply")
	require.Equal(t, uint64(2), l.b.q.ctr.RcvdPkts.Load(), "the retry was received")

	calls, _ := l.pace(l.b, paceBudget)
	for i, c := range calls {
		require.LessOrEqual(t, len(c), paceBudget, "call %d", i)
	}
	rest := flatten(calls)
	require.Len(t, rest, size/1024-paceBudget+size/1024-from)
	orig := append(first, rest[:size/1024-paceBudget]...)
	readResponses(t, orig, psn, true, 1024, l.b.buf[:size])
	replay := rest[size/1024-paceBudget:]
	readResponses(t, replay, psn.Add(from), false, 1024, l.b.buf[from*1024:size])
	require.Equal(t, uint64(1), l.b.q.ctr.ResponderResourceHit.Load())

	// The whole READ again: FIRST … LAST from the first PSN.
	l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn, va, rkey, size))
	calls, _ = l.pace(l.b, paceBudget)
	readResponses(t, flatten(calls), psn, true, 1024, l.b.buf[:size])

	// Two retries during a replay: both wait and are answered in turn.
	l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn.Add(200), va+200*1024, rkey, size-200*1024))
	require.True(t, l.b.q.Run(l.b.env, l.now, 8))
	head := l.b.env.take()
	require.Len(t, head, 8)
	l.receiveOnly(l.b, l.a,
		readRequest(t, l.b, psn.Add(250), va+250*1024, rkey, size-250*1024),
		readRequest(t, l.b, psn, va, rkey, 1024)) // a part of the READ: its first KiB
	calls, _ = l.pace(l.b, 7)
	for i, c := range calls {
		require.LessOrEqual(t, len(c), 7, "call %d", i)
	}
	got := flatten(calls)
	require.Len(t, got, 48+6+1)
	readResponses(t, append(head, got[:48]...), psn.Add(200), false, 1024, l.b.buf[200*1024:size])
	readResponses(t, got[48:54], psn.Add(250), false, 1024, l.b.buf[250*1024:size])
	readResponses(t, got[54:], psn, true, 1024, l.b.buf[:1024])
	require.Equal(t, uint64(5), l.b.q.ctr.ResponderResourceHit.Load())
}

// TestReadPacedDuplicateChecked: as rxe, a retry must ask for the
// READ or a part of it with the same rkey; anything else is dropped
// without an answer and without hurting the QP.
//
// Regression test: was TestRegressReadPacedDuplicateChecked in regress_readpace_test.go
// (added in commit de4611d).
func TestReadPacedDuplicateChecked(t *testing.T) {
	const size = 8 * 1024
	l := newLinkMTU(t, MTU1024)
	psn := PSN(0xFFFF00)
	va, rkey := l.b.m.IOVA()+4096, l.b.m.RKey()
	l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn, va, rkey, size))
	calls, _ := l.pace(l.b, paceBudget)
	require.Len(t, flatten(calls), 8)
	for _, c := range []struct {
		name string
		dup  []byte
	}{
		{"other rkey", readRequest(t, l.b, psn.Add(2), va+2048, rkey^0x100, size-2048)},
		{"before the READ", readRequest(t, l.b, psn.Add(2), va-1024, rkey, 2048)},
		{"past its end", readRequest(t, l.b, psn.Add(2), va+2048, rkey, size-2048+1)},
		{"longer", readRequest(t, l.b, psn, va, rkey, size+1024)},
		{"no READ at the PSN", readRequest(t, l.b, psn.Sub(1), va, rkey, 1024)},
	} {
		l.receiveOnly(l.b, l.a, c.dup)
		calls, _ := l.pace(l.b, paceBudget)
		require.Empty(t, flatten(calls), c.name)
		require.Equal(t, RTS, l.b.q.State(), c.name)
	}
	// A subset inside the READ is answered.
	l.receiveOnly(l.b, l.a, readRequest(t, l.b, psn.Add(3), va+3072, rkey, 2048))
	calls, _ = l.pace(l.b, paceBudget)
	readResponses(t, flatten(calls), psn.Add(3), false, 1024, l.b.buf[4096+3072:4096+3072+2048])
}

// TestReadPacedLaterRequestsWait: a second READ and an atomic that
// arrive during a reply are carried out after it, in order: responses in
// PSN order, the atomic executed only after the READ has read the word it
// changes, the MSN of each response that of its own request.
//
// Regression test: was TestRegressReadPacedLaterRequestsWait in regress_readpace_test.go
// (added in commit de4611d).
func TestReadPacedLaterRequestsWait(t *testing.T) {
	l := newLinkMTU(t, MTU1024)
	paceFill(l.b.buf)
	binary.NativeEndian.PutUint64(l.b.buf[1000:], 41)
	orig := append([]byte(nil), l.b.buf[:200*1024]...)
	const n1, n2 = 100 * 1024, 8*1024 + 3
	l.post(
		SendWR{ID: 1, Opcode: WRRDMARead, Flags: Signaled, SGL: []SGE{l.a.sge(0, n1)},
			RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()},
		SendWR{ID: 2, Opcode: WRAtomicFetchAndAdd, Flags: Signaled, CompareAdd: 1, SGL: []SGE{l.a.sge(n1, 8)},
			RemoteAddr: l.b.m.IOVA() + 1000, RKey: l.b.m.RKey()},
		SendWR{ID: 3, Opcode: WRRDMARead, Flags: Signaled, SGL: []SGE{l.a.sge(n1+8, n2)},
			RemoteAddr: l.b.m.IOVA() + 150*1024, RKey: l.b.m.RKey()})
	req := l.a.env.take()
	require.Equal(t, []wire.Opcode{wire.RCReadRequest, wire.RCFetchAdd, wire.RCReadRequest}, opcodes(req))
	l.receiveOnly(l.b, l.a, req...)
	require.Empty(t, l.b.env.take())
	require.Equal(t, uint64(41), binary.NativeEndian.Uint64(l.b.buf[1000:]), "the atomic waits behind the READ")

	calls, _ := l.pace(l.b, paceBudget)
	// 100 responses, the atomic ACK, 9 responses: 64, then 36+1+9.
	require.Equal(t, []int{64, 46}, []int{len(calls[0]), len(calls[1])})
	require.Len(t, calls, 2)
	resp := flatten(calls)
	psn0 := PSN(wire.BTH(req[0]).PSN())
	require.Equal(t, uint32(1), readResponses(t, resp[:100], psn0, true, 1024, orig[:n1]))
	var p wire.Packet
	require.NoError(t, p.Parse(resp[100]))
	require.Equal(t, wire.RCAtomicAck, p.Opcode)
	require.Equal(t, psn0.Add(100), PSN(p.BTH.PSN()))
	require.Equal(t, uint64(41), p.AtomicAckETH.OrigData())
	require.Equal(t, uint32(2), p.AETH.MSN())
	require.Equal(t, uint32(3), readResponses(t, resp[101:], psn0.Add(101), true, 1024, orig[150*1024:150*1024+n2]))
	require.Equal(t, uint64(42), binary.NativeEndian.Uint64(l.b.buf[1000:]))

	l.deliver(l.a, l.b, resp...)
	wcs := poll(t, l.a.scq)
	require.Len(t, wcs, 3)
	for i, wc := range wcs {
		require.Equal(t, WCSuccess, wc.Status)
		require.Equal(t, uint64(i+1), wc.ID)
	}
	require.Equal(t, orig[:n1], l.a.buf[:n1], "the READ saw the word before the atomic")
	require.Equal(t, uint64(41), binary.NativeEndian.Uint64(l.a.buf[n1:]))
	require.Equal(t, orig[150*1024:150*1024+n2], l.a.buf[n1+8:n1+8+n2])
}

// TestReadPacedSendFinishesReply: a request too long to wait in
// the queue (a SEND with payload) first lets the reply finish, so its ACK
// still follows every response before it.
//
// Regression test: was TestRegressReadPacedSendFinishesReply in regress_readpace_test.go
// (added in commit de4611d).
func TestReadPacedSendFinishesReply(t *testing.T) {
	l := newLinkMTU(t, MTU1024)
	paceFill(l.b.buf)
	require.NoError(t, l.b.q.PostRecv(&RecvWR{ID: 9, SGL: []SGE{l.b.sge(1<<19, 4096)}}))
	l.post(SendWR{ID: 1, Opcode: WRRDMARead, SGL: []SGE{l.a.sge(0, 100*1024)}, RemoteAddr: l.b.m.IOVA(), RKey: l.b.m.RKey()},
		SendWR{ID: 2, Opcode: WRSend, SGL: []SGE{l.a.sge(0, 1000)}})
	req := l.a.env.take()
	require.Len(t, req, 2)
	l.receiveOnly(l.b, l.a, req[0])
	require.True(t, l.b.q.Run(l.b.env, l.now, paceBudget))
	require.Len(t, l.b.env.take(), paceBudget)
	l.receiveOnly(l.b, l.a, req[1])
	out := l.b.env.take()
	require.Len(t, out, 36+1)
	readResponses(t, out[:36], PSN(wire.BTH(req[0]).PSN()).Add(64), false, 1024, l.b.buf[64*1024:100*1024])
	var p wire.Packet
	require.NoError(t, p.Parse(out[36]))
	require.Equal(t, wire.RCAck, p.Opcode)
	require.Equal(t, PSN(wire.BTH(req[1]).PSN()), PSN(p.BTH.PSN()))
	require.Len(t, poll(t, l.b.rcq), 1)
	require.False(t, l.b.q.Run(l.b.env, l.now, paceBudget))
}

// TestReadPacedQueueFull: more requests than the queue holds make
// the reply and the queue finish at once; nothing is lost or reordered.
//
// Regression test: was TestRegressReadPacedQueueFull in regress_readpace_test.go
// (added in commit de4611d).
func TestReadPacedQueueFull(t *testing.T) {
	const size = 128 * 1024
	l, psn, va, rkey, _ := pacedRead(t, size)
	last := func() []byte { return readRequest(t, l.b, psn.Add(127), va+127*1024, rkey, 1024) }
	for range heldRequests {
		l.receiveOnly(l.b, l.a, last())
	}
	require.Empty(t, l.b.env.take())
	l.receiveOnly(l.b, l.a, last()) // one more than fits
	out := l.b.env.take()
	require.Len(t, out, 64+heldRequests, "the rest of the reply and every held retry")
	readResponses(t, out[:64], psn.Add(64), false, 1024, l.b.buf[64*1024:size])
	for _, raw := range out[64:] {
		readResponses(t, [][]byte{raw}, psn.Add(127), false, 1024, l.b.buf[127*1024:size])
	}
	calls, _ := l.pace(l.b, paceBudget)
	require.Len(t, flatten(calls), 1, "the last retry is answered by Run")
}

// pacedMappedLink is a link whose responder's region lies in an anonymous
// mapping, which Close refuses while any Region over it is held.
func pacedMappedLink(t *testing.T) (*link, *mr.Mapping, *mr.MR) {
	l := newLinkMTU(t, MTU1024)
	m, err := mr.MapAnonymous(1 << 20)
	if err != nil {
		t.Skip("no mmap here:", err)
	}
	paceFill(m.Bytes())
	reg, err := l.b.mem.RegMR(l.b.pd, m.Bytes(), mr.RemoteRead, mr.WithMapping(m))
	require.NoError(t, err)
	l.receiveOnly(l.b, l.a, readRequest(t, l.b, 0xFFFF00, reg.IOVA(), reg.RKey(), 1<<20))
	require.True(t, l.b.q.Run(l.b.env, l.now, paceBudget))
	require.Len(t, l.b.env.take(), paceBudget)
	return l, m, reg
}

// TestReadPacedResetDropsReply: a QP reset or moved to ERR in the
// middle of a reply sends nothing more and holds no reference to the
// region: it deregisters and its mapping closes.
//
// Regression test: was TestRegressReadPacedResetDropsReply in regress_readpace_test.go
// (added in commit de4611d).
func TestReadPacedResetDropsReply(t *testing.T) {
	for _, st := range []State{Reset, Err} {
		t.Run(st.String(), func(t *testing.T) {
			l, m, reg := pacedMappedLink(t)
			require.ErrorIs(t, m.Close(), mr.ErrMappingBusy, "the region is registered")
			require.NoError(t, l.b.q.Modify(&Attr{State: st}, AttrState, l.now))
			require.False(t, l.b.q.Run(l.b.env, l.now, paceBudget))
			require.Empty(t, l.b.env.take())
			require.NoError(t, reg.Dereg())
			require.NoError(t, m.Close(), "no Region is held by the paused reply")
			require.False(t, l.b.q.resp.replying())
		})
	}
}

// TestReadPacedRegionGoneMidReply: a region deregistered between
// two bursts ends the reply as rxe's per-packet rkey re-check does
// (read_reply: rxe_recheck_mr fails, RESPST_ERR_RKEY_VIOLATION): a
// REMOTE_ACCESS NAK carrying the READ request's PSN, the QP in ERR. That
// PSN is behind the responses already delivered, so the requester (ours
// and rxe's check_psn alike) ignores the NAK and retries until its retry
// count runs out; it never completes the READ as a success.
//
// Regression test: was TestRegressReadPacedRegionGoneMidReply in regress_readpace_test.go
// (added in commit de4611d).
func TestReadPacedRegionGoneMidReply(t *testing.T) {
	l := newLink(t, RC, 1, 7) // MTU 256
	buf := make([]byte, 64*1024)
	paceFill(buf)
	reg, err := l.b.mem.RegMR(l.b.pd, buf, mr.RemoteRead)
	require.NoError(t, err)
	l.post(SendWR{ID: 5, Opcode: WRRDMARead, Flags: Signaled, SGL: []SGE{l.a.sge(0, len(buf))},
		RemoteAddr: reg.IOVA(), RKey: reg.RKey()})
	req := l.a.env.take()
	l.receiveOnly(l.b, l.a, req...)
	require.True(t, l.b.q.Run(l.b.env, l.now, paceBudget))
	resp := l.b.env.take()
	require.Len(t, resp, paceBudget)
	require.NoError(t, reg.Dereg())
	require.False(t, l.b.q.Run(l.b.env, l.now, paceBudget))
	nak := l.b.env.take()
	require.Len(t, nak, 1)
	var p wire.Packet
	require.NoError(t, p.Parse(nak[0]))
	require.Equal(t, wire.RCAck, p.Opcode)
	require.Equal(t, wire.SynNAK, p.AETH.Syndrome().Kind())
	require.Equal(t, uint8(wire.NAKRemoteAccess), p.AETH.Syndrome().NAKCode())
	require.Equal(t, PSN(wire.BTH(req[0]).PSN()), PSN(p.BTH.PSN()))
	require.Equal(t, Err, l.b.q.State())
	require.False(t, l.b.q.resp.replying())

	l.deliver(l.a, l.b, append(resp, nak...)...)
	require.Empty(t, poll(t, l.a.scq), "the stale NAK is ignored")
	require.Equal(t, buf[:64*256], l.a.buf[:64*256], "what arrived was placed")
	var wcs []WC
	// The requester's fast retransmits (recovery.go) fire between the
	// local ACK timeouts without spending retry_cnt: a few per timeout.
	for i := 0; i < 64 && len(wcs) == 0; i++ {
		l.now = l.a.q.Deadline()
		require.False(t, l.now.IsZero())
		l.a.q.OnTimer(l.a.env, l.now, paceBudget)
		for _, raw := range l.a.env.take() {
			require.NoError(t, p.Parse(raw))
			ri := RecvInfo{Src: l.a.addr, Dst: l.b.addr}
			require.Equal(t, DropState, l.b.q.Check(&p, &ri, l.b.addr.Addr()), "the responder is in ERR")
		}
		wcs = poll(t, l.a.scq)
	}
	require.Len(t, wcs, 1)
	require.Equal(t, WCRetryExcErr, wcs[0].Status)
}

// paceResponder is a lone RC QP in RTS (path MTU mtu, expecting PSN 0)
// whose 1 MiB region peers may read, for allocation counts and
// benchmarks.
func paceResponder(tb testing.TB, mtu MTU) (*QP, *mr.MR) {
	mem := mr.NewTable(nil)
	pd, err := mem.AllocPD()
	if err != nil {
		tb.Fatal(err)
	}
	scq, _ := NewCQ(16)
	rcq, _ := NewCQ(16)
	q, err := New(Config{Num: 0x12, Type: RC, PD: pd, Mem: mem, SendCQ: scq, RecvCQ: rcq,
		Cap: Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		tb.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	paceFill(buf)
	m, err := mem.RegMR(pd, buf, mr.RemoteRead)
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Unix(1000, 0)
	for _, s := range []struct {
		a    Attr
		mask AttrMask
	}{
		{Attr{State: Init, PortNum: 1, AccessFlags: AccessRemoteRead}, AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{Attr{State: RTR, AV: AddrVector{DGID: netip.MustParseAddr("10.0.0.1")}, PathMTU: mtu, DestQPN: 0x11,
			MaxDestRdAtomic: 16, MinRNRTimer: 3},
			AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer},
		{Attr{State: RTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
			AttrState | AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic},
	} {
		if err := q.Modify(&s.a, s.mask, now); err != nil {
			tb.Fatal(err)
		}
	}
	return q, m
}

// readRounds answers READs of n bytes, one after the other, counting on
// env.n for the responses.
type readRounds struct {
	q    *QP
	env  *ringEnv
	raw  []byte
	p    wire.Packet
	ri   RecvInfo
	psn  PSN
	npkt int
}

func newReadRounds(tb testing.TB, mtu MTU, n uint32) *readRounds {
	q, m := paceResponder(tb, mtu)
	h := wire.Headers{Opcode: wire.RCReadRequest, PKey: DefaultPKey, DestQP: q.Num(), AckReq: true,
		VA: m.IOVA(), RKey: m.RKey(), DMALen: n}
	buf := make([]byte, MaxPacketLen)
	_, size, err := h.EncodeHeaders(buf, 0)
	if err != nil {
		tb.Fatal(err)
	}
	return &readRounds{q: q, env: &ringEnv{}, raw: buf[:size], npkt: pktCount(int(n), mtu.Bytes()),
		ri: RecvInfo{Src: netip.MustParseAddrPort("10.0.0.1:4791"), Dst: netip.MustParseAddrPort("10.0.0.2:4791")}}
}

// round receives the next READ and runs the QP until its reply is out.
func (r *readRounds) round() error {
	wire.BTH(r.raw).SetPSN(uint32(r.psn))
	if err := r.p.Parse(r.raw); err != nil {
		return err
	}
	r.env.n = 0
	now := time.Unix(1000, 0)
	r.q.Receive(r.env, &r.p, &r.ri, now)
	for r.q.Run(r.env, now, paceBudget) {
	}
	if r.env.n != r.npkt || r.q.State() != RTS {
		return fmt.Errorf("%d responses of %d, QP %v", r.env.n, r.npkt, r.q.State())
	}
	r.psn = r.psn.Add(uint32(r.npkt))
	return nil
}

// TestReadReplyDoesNotAllocate: accepting a READ and sending its
// responses over several Runs allocates nothing in steady state.
func TestReadReplyDoesNotAllocate(t *testing.T) {
	r := newReadRounds(t, MTU1024, 200*1024)
	allocs := testing.AllocsPerRun(20, func() {
		if err := r.round(); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
}

// BenchmarkReadReplyPaced: 1 MiB READs at MTU 4096 answered 64
// responses per Run (256 responses, 4 Runs each).
func BenchmarkReadReplyPaced(b *testing.B) {
	r := newReadRounds(b, MTU4096, 1<<20)
	b.ReportAllocs()
	b.SetBytes(1 << 20)
	for b.Loop() {
		if err := r.round(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestReadPacedSameAsUnpaced: pacing changes when responses
// leave, never which: a seeded mix of READs (0 B to 200 KiB), retries of
// earlier READs from random PSNs, atomics and WRITEs into the memory the
// READs read, and an occasional PSN gap, fed to one responder that is run
// to completion after every request (the unpaced order) and to another
// that gets them in bursts and is run with random small budgets, yields
// the same packets, byte for byte, the same memory and the same state;
// no Run sends more than its budget.
//
// Regression test: was TestRegressReadPacedSameAsUnpaced in regress_readpace_test.go
// (added in commit de4611d).
func TestReadPacedSameAsUnpaced(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 4791))
			ref, paced := newLinkMTU(t, MTU1024), newLinkMTU(t, MTU1024)
			paceFill(ref.b.buf)
			paceFill(paced.b.buf)
			// A request is built for each responder: their regions have
			// their own addresses and keys.
			build := func(e *end, h wire.Headers, payload []byte) []byte {
				h.PKey, h.DestQP, h.RKey = DefaultPKey, e.q.Num(), e.m.RKey()
				h.VA += e.m.IOVA()
				raw := make([]byte, MaxPacketLen)
				off, size, err := h.EncodeHeaders(raw, len(payload))
				require.NoError(t, err)
				copy(raw[off:], payload)
				return raw[:size]
			}
			type read struct {
				psn PSN
				off uint64
				n   uint32
			}
			var reads []read
			psn := PSN(0xFFFF00)
			var refOut, pacedOut [][]byte
			runPaced := func(budget int) bool {
				more := paced.b.q.Run(paced.b.env, paced.now, budget)
				pk := paced.b.env.take()
				require.LessOrEqual(t, len(pk), budget)
				pacedOut = append(pacedOut, pk...)
				return more
			}
			for range 150 {
				// h.VA is an offset into the responder's region here.
				var h wire.Headers
				var payload []byte
				switch k := rng.IntN(20); {
				case k < 8: // a new READ
					n := uint32(rng.IntN(200*1024 + 1))
					if rng.IntN(4) == 0 {
						n = uint32(rng.IntN(3000))
					}
					off := uint64(rng.IntN(1<<20 - int(n) + 1))
					h = wire.Headers{Opcode: wire.RCReadRequest, PSN: uint32(psn), AckReq: true, VA: off, DMALen: n}
					reads = append(reads, read{psn, off, n})
					psn = psn.Add(uint32(pktCount(int(n), 1024)))
				case k < 12 && len(reads) > 0: // a retry of a recent READ
					r := reads[len(reads)-1-rng.IntN(min(len(reads), 20))]
					at := uint32(rng.IntN(pktCount(int(r.n), 1024)))
					h = wire.Headers{Opcode: wire.RCReadRequest, PSN: uint32(r.psn.Add(at)), AckReq: true,
						VA: r.off + uint64(at)*1024, DMALen: r.n - min(r.n, at*1024)}
				case k < 15: // an atomic on a word the READs read
					off := uint64(rng.IntN(1<<17)) * 8
					h = wire.Headers{Opcode: wire.RCFetchAdd, PSN: uint32(psn), AckReq: true, VA: off, SwapAdd: rng.Uint64()}
					if rng.IntN(2) == 0 {
						h.Opcode, h.Compare = wire.RCCompareSwap, binary.NativeEndian.Uint64(ref.b.buf[off:])
					}
					psn = psn.Next()
				case k < 19: // a WRITE: too long to wait in the queue
					n := 65 + rng.IntN(1024-65)
					h = wire.Headers{Opcode: wire.RCWriteOnly, PSN: uint32(psn), AckReq: rng.IntN(2) == 0,
						VA: uint64(rng.IntN(1<<20 - n)), DMALen: uint32(n)}
					payload = make([]byte, n)
					for i := range payload {
						payload[i] = byte(rng.IntN(256))
					}
					psn = psn.Next()
				default: // a request after a gap: PSN sequence NAK
					h = wire.Headers{Opcode: wire.RCReadRequest, PSN: uint32(psn.Add(5)), AckReq: true, DMALen: 8}
				}
				ref.receiveOnly(ref.b, ref.a, build(ref.b, h, payload))
				for ref.b.q.Run(ref.b.env, ref.now, 1<<30) {
				}
				refOut = append(refOut, ref.b.env.take()...)

				paced.receiveOnly(paced.b, paced.a, build(paced.b, h, payload))
				pacedOut = append(pacedOut, paced.b.env.take()...)
				for range rng.IntN(3) {
					if !runPaced(1 + rng.IntN(paceBudget)) {
						break
					}
				}
			}
			for runPaced(1 + rng.IntN(paceBudget)) {
			}
			require.Equal(t, len(refOut), len(pacedOut))
			for i := range refOut {
				require.Equal(t, refOut[i], pacedOut[i], "packet %d", i)
			}
			require.Equal(t, ref.b.buf, paced.b.buf)
			require.Equal(t, RTS, ref.b.q.State())
			require.Equal(t, RTS, paced.b.q.State())
			require.Equal(t, ref.b.q.resp.psn, paced.b.q.resp.psn)
			require.Equal(t, ref.b.q.resp.msn, paced.b.q.resp.msn)
		})
	}
}
