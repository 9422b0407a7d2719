package e2e

import (
	"net/netip"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/polltest"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/stretchr/testify/require"
)

// pollOK spins on cq.Poll until a completion arrives (failing after
// 20 s) and checks that it is the successful completion of id.
func pollOK(t testing.TB, cq *ib.CQ, id uint64, op ib.WCOpcode) ib.WC {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var wc [1]ib.WC
	for cq.Poll(wc[:]) == 0 {
		require.False(t, time.Now().After(deadline), "no completion for wr %d within 20s", id)
	}
	require.Equal(t, ib.WCSuccess.String(), wc[0].Status.String(), "wr %d", wc[0].ID)
	require.Equal(t, id, wc[0].ID)
	require.Equal(t, op.String(), wc[0].Opcode.String())
	return wc[0]
}

// TestCQPollReceivesItself: B's engine receives only when B's application
// polls (polltest.Only: its receive goroutine never gets a datagram), so
// everything B completes came in through ib.CQ.Poll and Engine.Progress.
// A writes messages of 1 byte to 16 KiB (up to 16 packets at MTU 1024,
// all handled by the poller) and then sends an immediate; B checks the
// bytes, writes them back and answers, while A waits in WaitPoll. Data
// arrives intact and in order, and nothing is retransmitted: B's ACKs
// leave although it sends them only from Poll, from its answers' posts or
// from its worker.
func TestCQPollReceivesItself(t *testing.T) {
	mk := func(a string, wrap bool) *node {
		addr := netip.MustParseAddr(a)
		// IBATimerOnly: B answers only while the test polls it, which
		// the requester's own round-trip timer (pkg/qp recovery.go)
		// would take for loss and resend early; the test is about the
		// polling path and counts every retransmission.
		cfg := ib.Config{Addrs: []netip.Addr{addr}, EphemeralPort: true, Workers: 2, IBATimerOnly: true}
		if wrap {
			cfg.Wrap = polltest.Only
		}
		return newNode(t, cfg, addr, nodeOpts{})
	}
	na, nb := mk("127.0.3.1", false), mk("127.0.3.2", true)
	// A 4.3 s ACK timeout: B receives only while the test polls it, so on
	// a loaded machine an ACK for B's answer may wait in B's socket well
	// past the default 67 ms; a retransmission then says an ACK was stuck.
	o := qpOpts{mtu: ib.MTU1024, timeout: 20}
	a, b := na.createQP(o), nb.createQP(o)
	connectQPs(t, na, a, nb, b, o)

	const half = 1 << 19 // A's data in the first half of each buffer, B's echo in the second
	sizes := []int{1, 8, 1000, 1024, 1025, 4096, 9000, 16384}
	for i := range 64 {
		require.NoError(t, b.PostRecv(ib.RecvWR{ID: uint64(i)}))
		require.NoError(t, a.PostRecv(ib.RecvWR{ID: uint64(i)}))
	}
	for i := range 200 {
		size := sizes[i%len(sizes)]
		off := (i % 16) * 16384
		fill(na.buf[off:off+size], i)
		require.NoError(t, a.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRRDMAWrite, SGL: []ib.SGE{sge(na, off, size)},
			RemoteAddr: nb.mr.IOVA() + uint64(off), RKey: nb.mr.RKey()}))
		require.NoError(t, a.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRSendWithImm, Flags: ib.SendSignaled, Imm: uint32(i)}))

		wc := pollOK(t, nb.rcq, uint64(i%64), ib.WCRecv)
		require.True(t, wc.Flags&ib.WCWithImm != 0)
		require.EqualValues(t, i, wc.Imm, "messages complete in order")
		require.Equal(t, na.buf[off:off+size], nb.buf[off:off+size], "message %d (%d bytes)", i, size)
		require.NoError(t, b.PostRecv(ib.RecvWR{ID: uint64(i % 64)}))

		require.NoError(t, b.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRRDMAWrite, SGL: []ib.SGE{sge(nb, off, size)},
			RemoteAddr: na.mr.IOVA() + half + uint64(off), RKey: na.mr.RKey()}))
		require.NoError(t, b.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRSendWithImm, Imm: uint32(i)}))
		waitOK(t, na.scq, uint64(i), ib.WCSend)
		wc = waitOK(t, na.rcq, uint64(i%64), ib.WCRecv)
		require.EqualValues(t, i, wc.Imm)
		require.Equal(t, na.buf[off:off+size], na.buf[half+off:half+off+size], "echo %d (%d bytes)", i, size)
		require.NoError(t, a.PostRecv(ib.RecvWR{ID: uint64(i % 64)}))
	}
	ca, cb := na.dev.Counters(), nb.dev.Counters()
	require.Zero(t, ca["completer_retry_err"]+cb["completer_retry_err"], "no retransmission")
	require.Zero(t, ca["out_of_seq_request"]+cb["out_of_seq_request"])
	require.Zero(t, ca["duplicate_request"]+cb["duplicate_request"])
}
