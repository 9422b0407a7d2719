package e2e

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// TestRCEveryMTUAndSize moves messages of sizes around every segment
// boundary with WRITE, WRITE_WITH_IMM, READ, SEND and SEND_WITH_IMM at
// every path MTU, checking the bytes and the completions on both sides.
func TestRCEveryMTUAndSize(t *testing.T) {
	for _, mtu := range []ib.MTU{ib.MTU256, ib.MTU512, ib.MTU1024, ib.MTU2048, ib.MTU4096} {
		t.Run(mtu.String(), func(t *testing.T) {
			na, a, nb, b := pair(t, qpOpts{mtu: mtu})
			m := mtu.Bytes()
			sizes := []int{0, 1, 3, m - 1, m, m + 1, 2 * m, 3*m + 5, 100000}
			id := uint64(0)
			for _, size := range sizes {
				for _, op := range []ib.WROpcode{ib.WRRDMAWrite, ib.WRRDMAWriteWithImm, ib.WRRDMARead, ib.WRSend, ib.WRSendWithImm} {
					id++
					src, dst := na.buf[:size], nb.buf[200000:200000+size]
					fill(src, int(id))
					clear(dst)
					wr := ib.SendWR{ID: id, Opcode: op, Flags: ib.SendSignaled, Imm: uint32(id) * 3,
						SGL: []ib.SGE{sge(na, 0, size)}, RemoteAddr: nb.mr.IOVA() + 200000, RKey: nb.mr.RKey()}
					if op == ib.WRRDMARead {
						fill(dst, int(id)+1)
						clear(src)
					}
					if op == ib.WRSend || op == ib.WRSendWithImm || op == ib.WRRDMAWriteWithImm {
						require.NoError(t, b.PostRecv(ib.RecvWR{ID: id + 1000, SGL: []ib.SGE{sge(nb, 200000, 100000)}}))
					}
					require.NoError(t, a.PostSend(wr))
					wcOp, _ := op.WCOpcode()
					wc := waitOK(t, na.scq, id, wcOp)
					require.Equal(t, uint32(size), wc.ByteLen)
					require.True(t, bytes.Equal(src, dst), "op %v size %d: data differs", op, size)
					switch op {
					case ib.WRSend, ib.WRSendWithImm, ib.WRRDMAWriteWithImm:
						want := ib.WCRecv
						if op == ib.WRRDMAWriteWithImm {
							want = ib.WCRecvRDMAWithImm
						}
						rwc := waitOK(t, nb.rcq, id+1000, want)
						require.Equal(t, uint32(size), rwc.ByteLen)
						require.Equal(t, b.Num(), rwc.QPNum)
						if op.HasImm() {
							require.Equal(t, uint32(id)*3, rwc.Imm)
							require.NotZero(t, rwc.Flags&ib.WCWithImm)
						} else {
							require.Zero(t, rwc.Flags&ib.WCWithImm)
						}
					}
				}
			}
			noCompletion(t, nb.rcq)
			// The in-memory network loses nothing, so nothing was ever
			// out of sequence (a slow machine may still see a spurious
			// retransmit, hence no claim about duplicates).
			require.Zero(t, nb.dev.Counters()["out_of_seq_request"])
		})
	}
}

// TestRCSGEListsInlineAndUnsignalled gathers from several SGEs, sends
// inline data, and checks that unsignalled WRs complete silently in order.
func TestRCSGEListsInlineAndUnsignalled(t *testing.T) {
	na, a, nb, b := pair(t, qpOpts{mtu: ib.MTU512})
	fill(na.buf[:8192], 1)
	// Three SGEs of odd sizes, scattered into two receive SGEs.
	sgl := []ib.SGE{sge(na, 0, 700), sge(na, 1000, 13), sge(na, 2000, 1500)}
	want := append(append(append([]byte{}, na.buf[0:700]...), na.buf[1000:1013]...), na.buf[2000:3500]...)
	require.NoError(t, b.PostRecv(ib.RecvWR{ID: 1, SGL: []ib.SGE{sge(nb, 10000, 1000), sge(nb, 20000, 2000)}}))
	require.NoError(t, a.PostSend(ib.SendWR{ID: 10, Opcode: ib.WRSend, SGL: sgl})) // unsignalled
	inline := []byte("inline payload, copied at post time")
	require.NoError(t, b.PostRecv(ib.RecvWR{ID: 2, SGL: []ib.SGE{sge(nb, 30000, 100)}}))
	require.NoError(t, a.PostSend(ib.SendWR{ID: 11, Opcode: ib.WRSend, Flags: ib.SendInline | ib.SendSignaled, Inline: inline}))
	clear(inline) // the post copied it
	wc := waitOK(t, na.scq, 11, ib.WCSend)
	require.Equal(t, uint32(35), wc.ByteLen)
	r1 := waitOK(t, nb.rcq, 1, ib.WCRecv)
	require.Equal(t, uint32(len(want)), r1.ByteLen)
	got := append(append([]byte{}, nb.buf[10000:11000]...), nb.buf[20000:20000+len(want)-1000]...)
	require.Equal(t, want, got)
	waitOK(t, nb.rcq, 2, ib.WCRecv)
	require.Equal(t, "inline payload, copied at post time", string(nb.buf[30000:30035]))
	noCompletion(t, na.scq) // WR 10 was unsignalled
}

// TestRCLargeMessage moves 16 MiB with one WRITE and one READ.
func TestRCLargeMessage(t *testing.T) {
	if testing.Short() {
		t.Skip("16 MiB transfer")
	}
	const size = 16 << 20
	net := newNetPair(t, size+4096)
	na, a, nb, _ := net.na, net.a, net.nb, net.b
	fill(na.buf[:size], 9)
	require.NoError(t, a.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{sge(na, 0, size)}, RemoteAddr: nb.mr.IOVA(), RKey: nb.mr.RKey()}))
	waitOK(t, na.scq, 1, ib.WCRDMAWrite)
	require.True(t, bytes.Equal(na.buf[:size], nb.buf[:size]))
	clear(na.buf[:size])
	require.NoError(t, a.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRRDMARead, Flags: ib.SendSignaled,
		SGL: []ib.SGE{sge(na, 0, size)}, RemoteAddr: nb.mr.IOVA(), RKey: nb.mr.RKey()}))
	waitOK(t, na.scq, 2, ib.WCRDMARead)
	require.True(t, bytes.Equal(na.buf[:size], nb.buf[:size]))
}

type netPair struct {
	na, nb *node
	a, b   *ib.QP
}

func newNetPair(t *testing.T, bufSize int) netPair {
	net := transport.NewMemNetwork()
	na := newMemNode(t, net, "10.1.0.1", nodeOpts{bufSize: bufSize})
	nb := newMemNode(t, net, "10.1.0.2", nodeOpts{bufSize: bufSize})
	o := qpOpts{mtu: ib.MTU4096}
	a, b := na.createQP(o), nb.createQP(o)
	connectQPs(t, na, a, nb, b, o)
	return netPair{na, nb, a, b}
}

// TestRCAtomicsAndFence runs CMP_SWP and FETCH_ADD and a fenced READ
// behind a WRITE.
func TestRCAtomicsAndFence(t *testing.T) {
	na, a, nb, _ := pair(t, qpOpts{})
	binary.NativeEndian.PutUint64(nb.buf[64:], 5)
	for i := 0; i < 10; i++ {
		require.NoError(t, a.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRAtomicFetchAndAdd, Flags: ib.SendSignaled,
			CompareAdd: 3, SGL: []ib.SGE{sge(na, 8*i, 8)}, RemoteAddr: nb.mr.IOVA() + 64, RKey: nb.mr.RKey()}))
	}
	for i := 0; i < 10; i++ {
		waitOK(t, na.scq, uint64(i), ib.WCFetchAdd)
		require.Equal(t, uint64(5+3*i), binary.NativeEndian.Uint64(na.buf[8*i:]))
	}
	require.Equal(t, uint64(35), binary.NativeEndian.Uint64(nb.buf[64:]))
	// CMP_SWP that fails (compare mismatch) leaves memory alone.
	require.NoError(t, a.PostSend(ib.SendWR{ID: 20, Opcode: ib.WRAtomicCmpAndSwp, Flags: ib.SendSignaled,
		CompareAdd: 1, Swap: 99, SGL: []ib.SGE{sge(na, 200, 8)}, RemoteAddr: nb.mr.IOVA() + 64, RKey: nb.mr.RKey()}))
	waitOK(t, na.scq, 20, ib.WCCompSwap)
	require.Equal(t, uint64(35), binary.NativeEndian.Uint64(na.buf[200:]))
	require.Equal(t, uint64(35), binary.NativeEndian.Uint64(nb.buf[64:]))
	// WRITE then fenced READ of the same bytes sees the write.
	fill(na.buf[1000:5000], 3)
	require.NoError(t, a.PostSend(
		ib.SendWR{ID: 30, Opcode: ib.WRRDMAWrite, SGL: []ib.SGE{sge(na, 1000, 4000)}, RemoteAddr: nb.mr.IOVA() + 8000, RKey: nb.mr.RKey()},
		ib.SendWR{ID: 31, Opcode: ib.WRRDMARead, Flags: ib.SendSignaled | ib.SendFence, SGL: []ib.SGE{sge(na, 20000, 4000)},
			RemoteAddr: nb.mr.IOVA() + 8000, RKey: nb.mr.RKey()}))
	waitOK(t, na.scq, 31, ib.WCRDMARead)
	require.Equal(t, na.buf[1000:5000], na.buf[20000:24000])
}

// TestRCRNRRecovers sends before the receive is posted: the responder
// NAKs with RNR and the requester retries until a receive appears.
func TestRCRNRRecovers(t *testing.T) {
	na, a, nb, b := pair(t, qpOpts{rnrRetry: 7, minRNR: 1})
	fill(na.buf[:3000], 4)
	require.NoError(t, a.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: []ib.SGE{sge(na, 0, 3000)}}))
	require.Eventually(t, func() bool { return nb.dev.Counters()["send_rnr_err"] >= 2 }, 10*time.Second, time.Millisecond)
	noCompletion(t, na.scq)
	require.NoError(t, b.PostRecv(ib.RecvWR{ID: 9, SGL: []ib.SGE{sge(nb, 0, 4096)}}))
	waitOK(t, na.scq, 1, ib.WCSend)
	rwc := waitOK(t, nb.rcq, 9, ib.WCRecv)
	require.Equal(t, uint32(3000), rwc.ByteLen)
	require.Equal(t, na.buf[:3000], nb.buf[:3000])
	require.GreaterOrEqual(t, na.dev.Counters()["rcvd_rnr_err"], uint64(2))
	require.Equal(t, ib.QPSRTS, a.State())
}

// TestRCRNRRetryExceeded: with rnr_retry 0 the first RNR NAK fails the
// WR with RNR_RETRY_EXC_ERR and the QP goes to ERR, flushing the rest.
func TestRCRNRRetryExceeded(t *testing.T) {
	na, a, nb, _ := pair(t, qpOpts{rnrRetry: 0})
	require.NoError(t, a.PostSend(
		ib.SendWR{ID: 1, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: []ib.SGE{sge(na, 0, 10)}},
		ib.SendWR{ID: 2, Opcode: ib.WRRDMAWrite, SGL: []ib.SGE{sge(na, 0, 10)}, RemoteAddr: nb.mr.IOVA(), RKey: nb.mr.RKey()}))
	wc := wait(t, na.scq, 10*time.Second)
	require.Equal(t, uint64(1), wc.ID)
	require.Equal(t, ib.WCRNRRetryExcErr.String(), wc.Status.String())
	wc = wait(t, na.scq, 10*time.Second)
	require.Equal(t, uint64(2), wc.ID)
	require.Equal(t, ib.WCWRFlushErr.String(), wc.Status.String())
	require.Equal(t, ib.QPSErr, a.State())
	require.Equal(t, uint64(1), na.dev.Counters()["retry_rnr_exceeded_err"])
	ev := <-na.dev.Events() // PORT_ACTIVE first
	require.Equal(t, ib.EventPortActive, ev.Type)
	ev = <-na.dev.Events()
	require.Equal(t, ib.EventQPFatal, ev.Type)
	require.Equal(t, a.Num(), ev.QPN)
}

// TestRCRetryExceeded: a peer that never answers exhausts retry_cnt.
func TestRCRetryExceeded(t *testing.T) {
	na, a, nb, b := pair(t, qpOpts{timeout: 1, retry: 3})
	require.NoError(t, b.Destroy()) // the responder vanishes: nothing is ever ACKed
	require.NoError(t, a.PostSend(ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
		SGL: []ib.SGE{sge(na, 0, 100)}, RemoteAddr: nb.mr.IOVA(), RKey: nb.mr.RKey()}))
	wc := wait(t, na.scq, 10*time.Second)
	require.Equal(t, ib.WCRetryExcErr.String(), wc.Status.String())
	require.Equal(t, ib.QPSErr, a.State())
	c := na.dev.Counters()
	require.Equal(t, uint64(1), c["retry_exceeded_err"])
	require.Equal(t, uint64(3), c["completer_retry_err"])
	// The original and three retries reach the peer, which has no QP.
	require.Eventually(t, func() bool { return nb.dev.Counters()["drop_qp"] == 4 }, 5*time.Second, time.Millisecond)
}

// TestRCRemoteErrorsLeaveMemoryUntouched: a bad rkey, an rkey of another
// PD, a region without the access right, an address out of range and a
// QP without remote access each give the IBA error at the requester,
// move both QPs to ERR, and never touch the target memory.
func TestRCRemoteErrorsLeaveMemoryUntouched(t *testing.T) {
	cases := []struct {
		name   string
		setup  func(nb *node) (addr uint64, rkey uint32)
		op     ib.WROpcode
		status ib.WCStatus
		qpAcc  ib.Access
	}{
		{"bad rkey", func(nb *node) (uint64, uint32) { return nb.mr.IOVA(), nb.mr.RKey() ^ 0x55 }, ib.WRRDMAWrite, ib.WCRemAccessErr, 0},
		{"other PD", func(nb *node) (uint64, uint32) {
			pd2, err := nb.dev.AllocPD()
			require.NoError(nb.t, err)
			m, err := pd2.RegMR(nb.buf, ib.AccessLocalWrite|ib.AccessRemoteWrite|ib.AccessRemoteRead)
			require.NoError(nb.t, err)
			return m.IOVA(), m.RKey()
		}, ib.WRRDMAWrite, ib.WCRemAccessErr, 0},
		{"no remote write on MR", func(nb *node) (uint64, uint32) {
			m, err := nb.pd.RegMR(nb.buf, ib.AccessLocalWrite|ib.AccessRemoteRead)
			require.NoError(nb.t, err)
			return m.IOVA(), m.RKey()
		}, ib.WRRDMAWrite, ib.WCRemAccessErr, 0},
		{"out of range", func(nb *node) (uint64, uint32) { return nb.mr.IOVA() + uint64(len(nb.buf)) - 100, nb.mr.RKey() }, ib.WRRDMAWrite, ib.WCRemAccessErr, 0},
		{"out of range atomic", func(nb *node) (uint64, uint32) { return nb.mr.IOVA() + uint64(len(nb.buf)), nb.mr.RKey() }, ib.WRAtomicFetchAndAdd, ib.WCRemAccessErr, 0},
		{"no remote read on MR", func(nb *node) (uint64, uint32) {
			m, err := nb.pd.RegMR(nb.buf, ib.AccessLocalWrite|ib.AccessRemoteWrite)
			require.NoError(nb.t, err)
			return m.IOVA(), m.RKey()
		}, ib.WRRDMARead, ib.WCRemAccessErr, 0},
		{"QP without remote write", func(nb *node) (uint64, uint32) { return nb.mr.IOVA(), nb.mr.RKey() }, ib.WRRDMAWrite, ib.WCRemInvReqErr, ib.AccessRemoteRead},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := qpOpts{access: tc.qpAcc}
			na, a, nb, b := pair(t, o)
			addr, rkey := tc.setup(nb)
			snapshot := append([]byte(nil), nb.buf...)
			fill(na.buf[:5000], 1)
			wr := ib.SendWR{ID: 1, Opcode: tc.op, Flags: ib.SendSignaled, SGL: []ib.SGE{sge(na, 0, 5000)},
				RemoteAddr: addr, RKey: rkey, CompareAdd: 1}
			if tc.op == ib.WRAtomicFetchAndAdd {
				wr.SGL = []ib.SGE{sge(na, 0, 8)}
			}
			require.NoError(t, a.PostSend(wr))
			wc := wait(t, na.scq, 10*time.Second)
			require.Equal(t, tc.status.String(), wc.Status.String())
			require.Equal(t, ib.QPSErr, a.State())
			require.Eventually(t, func() bool { return b.State() == ib.QPSErr }, 5*time.Second, time.Millisecond)
			require.True(t, bytes.Equal(snapshot, nb.buf), "target memory changed")
		})
	}
}

// TestRCFlushOnErrorAndPostAfterError: moving a QP to ERR flushes posted
// receives and later sends with WR_FLUSH_ERR.
func TestRCFlushOnErrorAndPostAfterError(t *testing.T) {
	na, a, _, _ := pair(t, qpOpts{})
	for i := 0; i < 3; i++ {
		require.NoError(t, a.PostRecv(ib.RecvWR{ID: uint64(100 + i), SGL: []ib.SGE{sge(na, 0, 10)}}))
	}
	require.NoError(t, a.Modify(&ib.QPAttr{State: ib.QPSErr}, ib.AttrState))
	for i := 0; i < 3; i++ {
		wc := wait(t, na.rcq, 5*time.Second)
		require.Equal(t, uint64(100+i), wc.ID)
		require.Equal(t, ib.WCWRFlushErr.String(), wc.Status.String())
	}
	require.NoError(t, a.PostSend(ib.SendWR{ID: 7, Opcode: ib.WRSend, SGL: []ib.SGE{sge(na, 0, 10)}}))
	wc := wait(t, na.scq, 5*time.Second)
	require.Equal(t, uint64(7), wc.ID)
	require.Equal(t, ib.WCWRFlushErr.String(), wc.Status.String())
	// Posting on a RESET QP is refused.
	require.NoError(t, a.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
	err := a.PostSend(ib.SendWR{ID: 8, Opcode: ib.WRSend})
	require.Error(t, err)
	var pe *ib.PostError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 0, pe.Index)
	require.Contains(t, pe.Error(), "work request 0")
}
