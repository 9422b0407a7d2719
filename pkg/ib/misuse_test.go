package ib_test

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// Misuse of the verbs must return a clear error and change nothing:
// every test here takes a snapshot of what a refused call could have
// touched (QP state and attributes, queue contents, CQs, counters, the
// memory table) and compares it afterwards, then shows that the objects
// still work.

// world is what a misuse can disturb.
type world struct {
	state    ib.QPState
	attr     ib.QPAttr
	cqLen    [2]int
	counters map[string]uint64
	objects  [3]int // PDs, MRs, MWs of the device's memory table
}

func snapshot(t *testing.T, a, b *peer, q *ib.QP) world {
	t.Helper()
	w := world{state: q.State(), cqLen: [2]int{a.cq.Len(), b.cq.Len()}, counters: a.dev.Counters()}
	var err error
	w.attr, _, err = q.Query()
	require.NoError(t, err)
	w.objects[0], w.objects[1], w.objects[2] = a.dev.Engine().Memory().Counts()
	return w
}

func requireUnchanged(t *testing.T, before world, a, b *peer, q *ib.QP) {
	t.Helper()
	require.Equal(t, before, snapshot(t, a, b, q), "a refused verb changed something")
}

// testPair opens two peers with an RC QP each, in RESET; the caller
// connects them when it needs to.
func testPair(t *testing.T) (*peer, *ib.QP, *peer, *ib.QP) {
	t.Helper()
	net := transport.NewMemNetwork()
	a, b := openPeer(net, "10.9.0.1"), openPeer(net, "10.9.0.2")
	t.Cleanup(func() { a.close(); b.close() })
	return a, a.createQP(ib.RC), b, b.createQP(ib.RC)
}

// connections numbers the connections newPSN starts.
var connections atomic.Uint32

// newPSN is the first PSN of a new connection of a test's QPs: each call
// a different one, 4096 apart, as far from the last connection's as
// rdma_cm's random ones would likely be.
func newPSN() uint32 { return (100 + connections.Add(1)<<12) & 0xFFFFFF }

// connectBoth connects qa and qb to each other (connectRC both ways),
// each time from first PSNs of its own, as rdma_cm's random ones are.
// Tests recover a pair after an error by RESET and connectBoth; from the
// old PSNs, a request the old requester resent before its NAK came back
// (a loaded machine: the retransmit timer is 67 ms) reached the new
// responder as its next request, was refused again and put it in ERR, and
// the test's next request ended in RETRY_EXC_ERR (TestFastRegLifecycle,
// once in 150 runs under -cpu 4 and load; the access matrix's fc81544
// before it). From new PSNs it is an old duplicate
// (TestReconnectTakesTheOldConnectionsResendForADuplicate).
func connectBoth(a *peer, qa *ib.QP, b *peer, qb *ib.QP) {
	psn := newPSN()
	connectRCAccessPSN(a, qa, b, qb, remoteAll, psn)
	connectRCAccessPSN(b, qb, a, qa, remoteAll, psn)
}

// requireWorks shows the QPs still carry a message after a misuse, and
// that the first completion on each side is this message's: nothing a
// refused post tried to queue was queued.
func requireWorks(t *testing.T, a *peer, qa *ib.QP, b *peer, qb *ib.QP) {
	t.Helper()
	require.NoError(t, qb.PostRecv(ib.RecvWR{ID: 4242, SGL: []ib.SGE{b.sge(60<<10, 64)}}))
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 4243, Opcode: ib.WRSend, Flags: ib.SendSignaled | ib.SendInline,
		Inline: []byte("still works")}))
	swc, rwc := next(a.cq), next(b.cq)
	require.Equal(t, uint64(4243), swc.ID)
	require.Equal(t, ib.WCSuccess.String(), swc.Status.String())
	require.Equal(t, uint64(4242), rwc.ID)
	require.Equal(t, "still works", string(b.buf[60<<10:60<<10+rwc.ByteLen]))
}

func requirePostError(t *testing.T, err error, index int, want error) {
	t.Helper()
	require.Error(t, err)
	var pe *ib.PostError
	require.True(t, errors.As(err, &pe), "want a *PostError, got %T %v", err, err)
	require.Equal(t, index, pe.Index, "index of the refused work request")
	require.ErrorIs(t, err, want)
}

func TestPostBeforeReadyRefused(t *testing.T) {
	a, qa, b, qb := testPair(t)
	send := ib.SendWR{ID: 1, Opcode: ib.WRSend, Flags: ib.SendSignaled, SGL: []ib.SGE{a.sge(0, 8)}}
	recv := ib.RecvWR{ID: 2, SGL: []ib.SGE{a.sge(0, 8)}}

	// RESET: neither sends nor receives.
	before := snapshot(t, a, b, qa)
	requirePostError(t, qa.PostSend(send), 0, ib.ErrQPState)
	requirePostError(t, qa.PostRecv(recv), 0, ib.ErrQPState)
	requireUnchanged(t, before, a, b, qa)

	// INIT and RTR: receives yes (IBA lets a QP be primed before it is
	// connected), sends no.
	require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, AccessFlags: ib.AccessRemoteWrite},
		ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags))
	before = snapshot(t, a, b, qa)
	requirePostError(t, qa.PostSend(send, send), 0, ib.ErrQPState)
	requireUnchanged(t, before, a, b, qa)
	require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSRTR, PathMTU: ib.MTU1024, DestQPN: qb.Num(), RQPSN: 100,
		MaxDestRdAtomic: 4, MinRNRTimer: 1, AV: ib.AddrVector{DGID: b.addr, PortNum: 1}},
		ib.AttrState|ib.AttrAV|ib.AttrPathMTU|ib.AttrDestQPN|ib.AttrRQPSN|ib.AttrMaxDestRdAtomic|ib.AttrMinRNRTimer))
	before = snapshot(t, a, b, qa)
	requirePostError(t, qa.PostSend(send), 0, ib.ErrQPState)
	requireUnchanged(t, before, a, b, qa)

	// Back to RESET and connect for real: only the later message shows up.
	require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
	connectBoth(a, qa, b, qb)
	requireWorks(t, a, qa, b, qb)
	require.Equal(t, 0, a.cq.Len())
}

func TestTooManySGEsRefused(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	three := []ib.SGE{a.sge(0, 8), a.sge(8, 8), a.sge(16, 8)} // the QPs allow 2
	before := snapshot(t, a, b, qa)
	ok := ib.SendWR{ID: 1, Opcode: ib.WRRDMAWrite, SGL: three[:2], RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}
	bad := ok
	bad.ID, bad.SGL = 2, three
	// A refused WR in the middle of a list: the ones before it were
	// posted (ibv_post_send's bad_wr), so put it first to change nothing.
	requirePostError(t, qa.PostSend(bad, ok), 0, ib.ErrTooManySGE)
	requirePostError(t, qa.PostRecv(ib.RecvWR{ID: 3, SGL: three}), 0, ib.ErrTooManySGE)
	require.Contains(t, qa.PostSend(bad).Error(), "max_send_sge 2")
	requireUnchanged(t, before, a, b, qa)
	requireWorks(t, a, qa, b, qb)
}

func TestWRListLargerThanQueue(t *testing.T) {
	net := transport.NewMemNetwork()
	a, b := openPeer(net, "10.9.1.1"), openPeer(net, "10.9.1.2")
	defer a.close()
	defer b.close()
	small := func(p *peer) *ib.QP {
		q, err := p.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: p.cq, RecvCQ: p.cq,
			Cap: ib.QPCap{MaxSendWR: 4, MaxRecvWR: 3, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 16}})
		require.NoError(t, err)
		return q
	}
	qa, qb := small(a), small(b)
	connectBoth(a, qa, b, qb)

	// Receive queue of 3: a list of 5 posts 3 and names the 4th.
	var recvs []ib.RecvWR
	for i := range 5 {
		recvs = append(recvs, ib.RecvWR{ID: uint64(10 + i), SGL: []ib.SGE{b.sge(i*64, 64)}})
	}
	requirePostError(t, qb.PostRecv(recvs...), 3, ib.ErrRecvFull)

	// Send queue of 4: a list of 6 posts 4 and names the 5th; nothing
	// runs before the post returns, so exactly 4 execute.
	var sends []ib.SendWR
	for i := range 6 {
		sends = append(sends, ib.SendWR{ID: uint64(i), Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled,
			SGL: []ib.SGE{a.sge(i, 1)}, RemoteAddr: b.mr.IOVA() + 1024 + uint64(i), RKey: b.mr.RKey()})
		a.buf[i] = byte('A' + i)
	}
	requirePostError(t, qa.PostSend(sends...), 4, ib.ErrSendFull)
	for i := range 4 {
		wc := next(a.cq)
		require.Equal(t, uint64(i), wc.ID)
		require.Equal(t, ib.WCSuccess.String(), wc.Status.String())
	}
	require.Equal(t, "ABCD\x00\x00", string(b.buf[1024:1030]), "the refused WRs never ran")
	// The three posted receives are there, in order, and nothing else.
	for i := range 3 {
		require.NoError(t, qa.PostSend(ib.SendWR{ID: uint64(20 + i), Opcode: ib.WRSend, Flags: ib.SendInline, Inline: []byte{byte(i)}}))
		wc := next(b.cq)
		require.Equal(t, uint64(10+i), wc.ID)
	}
	require.Equal(t, 0, b.cq.Len())
}

func TestInlineMisuseRefused(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	before := snapshot(t, a, b, qa)
	long := make([]byte, 65) // the QPs allow 64
	requirePostError(t, qa.PostSend(ib.SendWR{Opcode: ib.WRSend, Flags: ib.SendInline, Inline: long}), 0, ib.ErrInlineTooLong)
	requirePostError(t, qa.PostSend(ib.SendWR{Opcode: ib.WRRDMARead, Flags: ib.SendInline, Inline: long[:8],
		RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}), 0, ib.ErrInlineOpcode)
	requireUnchanged(t, before, a, b, qa)
	requireWorks(t, a, qa, b, qb)
}

func TestBadWorkRequestsRefused(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	before := snapshot(t, a, b, qa)
	atomic := ib.SendWR{Opcode: ib.WRAtomicFetchAndAdd, SGL: []ib.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.IOVA() + 4, RKey: b.mr.RKey()}
	requirePostError(t, qa.PostSend(atomic), 0, ib.ErrAtomicAlign)
	atomic.RemoteAddr, atomic.SGL = b.mr.IOVA(), []ib.SGE{a.sge(0, 4)}
	requirePostError(t, qa.PostSend(atomic), 0, ib.ErrAtomicSGE)
	requirePostError(t, qa.PostSend(ib.SendWR{Opcode: ib.WRSend, Flags: 1 << 7}), 0, ib.ErrBadSendFlags)
	requirePostError(t, qa.PostSend(ib.SendWR{Opcode: ib.WROpcode(99)}), 0, ib.ErrBadOpcode)
	requireUnchanged(t, before, a, b, qa)
	requireWorks(t, a, qa, b, qb)

	// RDMA is not a UD operation; a UD send needs an address.
	ud := a.createQP(ib.UD)
	require.NoError(t, ud.Modify(&ib.QPAttr{State: ib.QPSInit, PortNum: 1, QKey: 1}, ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrQKey))
	require.NoError(t, ud.Modify(&ib.QPAttr{State: ib.QPSRTR}, ib.AttrState))
	require.NoError(t, ud.Modify(&ib.QPAttr{State: ib.QPSRTS}, ib.AttrState|ib.AttrSQPSN))
	requirePostError(t, ud.PostSend(ib.SendWR{Opcode: ib.WRRDMAWrite, SGL: []ib.SGE{a.sge(0, 8)}}), 0, ib.ErrBadOpcode)
	requirePostError(t, ud.PostSend(ib.SendWR{Opcode: ib.WRSend, SGL: []ib.SGE{a.sge(0, 8)}}), 0, ib.ErrNoUDDest)
}

func TestRegMRMisuseRefused(t *testing.T) {
	a, qa, b, _ := testPair(t)
	before := snapshot(t, a, b, qa)
	cases := []struct {
		name   string
		buf    []byte
		access ib.Access
		want   error
	}{
		{"nil buffer", nil, ib.AccessLocalWrite, ib.ErrEmptyBuffer},
		{"empty buffer", make([]byte, 0, 16), ib.AccessLocalWrite, ib.ErrEmptyBuffer},
		{"remote write without local write", make([]byte, 16), ib.AccessRemoteWrite, ib.ErrAccessCombo},
		{"remote atomic without local write", make([]byte, 16), ib.AccessRemoteRead | ib.AccessRemoteAtomic, ib.ErrAccessCombo},
		{"unknown access bit", make([]byte, 16), ib.AccessLocalWrite | 1<<30, ib.ErrUnsupportedAccess},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := a.pd.RegMR(c.buf, c.access)
			require.ErrorIs(t, err, c.want)
			require.Nil(t, m)
			requireUnchanged(t, before, a, b, qa)
		})
	}
	// Fast-registration misuse.
	_, err := a.pd.AllocMR(0)
	require.Error(t, err)
	fmr, err := a.pd.AllocMR(64)
	require.NoError(t, err)
	require.ErrorIs(t, a.pd.MapMR(fmr, make([]byte, 65)), ib.ErrMapTooBig)
	require.ErrorIs(t, a.pd.MapMR(fmr, nil), ib.ErrEmptyBuffer)
	require.ErrorIs(t, a.pd.MapMR(a.mr, make([]byte, 8)), ib.ErrNotFastMR, "a user region is not a fast one")
	require.ErrorIs(t, b.pd.MapMR(fmr, make([]byte, 8)), ib.ErrNotFastMR, "another device's PD")
	require.NoError(t, fmr.Dereg())
}

func TestDestroyInUseRefused(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	before := snapshot(t, a, b, qa)
	// A CQ, an SRQ and a PD with QPs on them cannot go.
	err := a.cq.Destroy()
	require.ErrorIs(t, err, ib.ErrBusy)
	require.Contains(t, err.Error(), "2 QPs", "send and receive CQ of one QP")
	require.ErrorIs(t, a.pd.Dealloc(), ib.ErrPDBusy)
	requireUnchanged(t, before, a, b, qa)
	requireWorks(t, a, qa, b, qb)

	// A PD with only a QP (no regions) is busy too; once the QP is gone
	// the PD, CQ and SRQ can be destroyed.
	pd, err := a.dev.AllocPD()
	require.NoError(t, err)
	cq, err := a.dev.CreateCQ(4)
	require.NoError(t, err)
	srq, err := pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 4, MaxSGE: 1})
	require.NoError(t, err)
	q, err := pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: ib.QPCap{MaxSendWR: 1, MaxSendSGE: 1}})
	require.NoError(t, err)
	require.ErrorIs(t, pd.Dealloc(), ib.ErrPDBusy)
	require.ErrorIs(t, cq.Destroy(), ib.ErrBusy)
	require.ErrorIs(t, srq.Destroy(), ib.ErrBusy)
	require.NoError(t, srq.PostRecv(ib.RecvWR{ID: 1}), "the SRQ still works")
	require.NoError(t, q.Destroy())
	require.ErrorIs(t, q.Destroy(), ib.ErrDestroyed)
	requirePostError(t, q.PostSend(ib.SendWR{Opcode: ib.WRSend}), 0, ib.ErrDestroyed)
	requirePostError(t, q.PostRecv(ib.RecvWR{}), 0, ib.ErrDestroyed)
	require.ErrorIs(t, q.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState), ib.ErrDestroyed)
	require.ErrorIs(t, pd.Dealloc(), ib.ErrPDBusy, "the SRQ still holds the PD")
	require.NoError(t, srq.Destroy())
	require.ErrorIs(t, srq.Destroy(), ib.ErrDestroyed)
	require.NoError(t, cq.Destroy())
	require.NoError(t, pd.Dealloc())
	require.ErrorIs(t, pd.Dealloc(), ib.ErrBadPD)
	_, err = pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: a.cq, RecvCQ: a.cq})
	require.ErrorIs(t, err, ib.ErrBadPD, "no QP on a deallocated PD")
}

func TestModifyBadMaskRefused(t *testing.T) {
	a, qa, b, qb := testPair(t)
	initAttr := &ib.QPAttr{State: ib.QPSInit, PortNum: 1, AccessFlags: ib.AccessRemoteWrite, PathMTU: ib.MTU512}
	rtrAttr := &ib.QPAttr{State: ib.QPSRTR, PathMTU: ib.MTU2048, DestQPN: qb.Num(), RQPSN: 5,
		MaxDestRdAtomic: 4, MinRNRTimer: 1, AV: ib.AddrVector{DGID: b.addr, PortNum: 1}}
	rtrMask := ib.AttrState | ib.AttrAV | ib.AttrPathMTU | ib.AttrDestQPN | ib.AttrRQPSN | ib.AttrMaxDestRdAtomic | ib.AttrMinRNRTimer
	cases := []struct {
		name  string
		setup func()
		attr  *ib.QPAttr
		mask  ib.QPAttrMask
		kind  error
		names string // the attribute the error must name
	}{
		{"RESET->INIT without port", nil, initAttr, ib.AttrState | ib.AttrPKeyIndex | ib.AttrAccessFlags, ib.ErrMissingAttr, "IBV_QP_PORT"},
		{"RESET->INIT without access flags", nil, initAttr, ib.AttrState | ib.AttrPKeyIndex | ib.AttrPort, ib.ErrMissingAttr, "IBV_QP_ACCESS_FLAGS"},
		{"RESET->INIT with a path MTU", nil, initAttr, ib.AttrState | ib.AttrPKeyIndex | ib.AttrPort | ib.AttrAccessFlags | ib.AttrPathMTU, ib.ErrAttrNotAllowed, "IBV_QP_PATH_MTU"},
		{"RESET->INIT with a Q_Key on RC", nil, initAttr, ib.AttrState | ib.AttrPKeyIndex | ib.AttrPort | ib.AttrAccessFlags | ib.AttrQKey, ib.ErrAttrNotAllowed, "IBV_QP_QKEY"},
		{"RESET->RTS", nil, &ib.QPAttr{State: ib.QPSRTS}, ib.AttrState, ib.ErrInvalidTransition, "RESET->RTS"},
		{"INIT->RTR without dest QPN", func() {
			require.NoError(t, qa.Modify(initAttr, ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags))
		}, rtrAttr, rtrMask &^ ib.AttrDestQPN, ib.ErrMissingAttr, "IBV_QP_DEST_QPN"},
		{"INIT->RTR with a bad MTU", nil, &ib.QPAttr{State: ib.QPSRTR, PathMTU: 9, DestQPN: 1, AV: rtrAttr.AV,
			MaxDestRdAtomic: 1, MinRNRTimer: 1}, rtrMask, ib.ErrAttrValue, "IBV_QP_PATH_MTU"},
		{"INIT->RTR with an SQ PSN", nil, rtrAttr, rtrMask | ib.AttrSQPSN, ib.ErrAttrNotAllowed, "IBV_QP_SQ_PSN"},
		{"INIT->RTS", nil, &ib.QPAttr{State: ib.QPSRTS}, ib.AttrState | ib.AttrSQPSN, ib.ErrInvalidTransition, "INIT->RTS"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.setup != nil {
				c.setup()
			}
			before := snapshot(t, a, b, qa)
			err := qa.Modify(c.attr, c.mask)
			require.ErrorIs(t, err, c.kind)
			var me *ib.ModifyError
			require.True(t, errors.As(err, &me))
			require.True(t, strings.Contains(err.Error(), c.names), "%q should name %s", err, c.names)
			requireUnchanged(t, before, a, b, qa)
		})
	}
	// After all the refusals the QP still connects and works.
	require.NoError(t, qa.Modify(&ib.QPAttr{State: ib.QPSReset}, ib.AttrState))
	connectBoth(a, qa, b, qb)
	requireWorks(t, a, qa, b, qb)
}

func TestCreateMisuseRefused(t *testing.T) {
	a, qa, b, _ := testPair(t)
	before := snapshot(t, a, b, qa)
	_, err := a.dev.CreateCQ(0)
	require.ErrorIs(t, err, ib.ErrCQSize)
	_, err = a.dev.CreateCQ(ib.MaxCQE + 1)
	require.ErrorIs(t, err, ib.ErrCQSize)
	_, err = a.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: a.cq})
	require.Error(t, err, "no receive CQ")
	_, err = a.pd.CreateQP(ib.QPInitAttr{Type: ib.QPType(9), SendCQ: a.cq, RecvCQ: a.cq})
	require.Error(t, err, "unknown QP type")
	_, err = a.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: a.cq, RecvCQ: a.cq, Cap: ib.QPCap{MaxSendSGE: 1000}})
	require.ErrorContains(t, err, "max_send_sge")
	_, err = a.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 0, MaxSGE: 1})
	require.Error(t, err)
	_, err = a.pd.CreateSRQ(ib.SRQInitAttr{MaxWR: 4, MaxSGE: 1, Limit: -1})
	require.Error(t, err, "negative limit")
	_, err = a.pd.CreateAH(ib.AHAttr{})
	require.Error(t, err, "no destination")
	_, err = a.pd.CreateAH(ib.AHAttr{DGID: b.addr, SGIDIndex: 3})
	require.Error(t, err, "no such source GID")
	requireUnchanged(t, before, a, b, qa)
	require.ErrorIs(t, a.pd.Dealloc(), ib.ErrPDBusy, "a refused CreateQP holds nothing, the real ones do")
}

// After Device.Close every verb that would need the engine fails with
// ErrDeviceClosed instead of queueing work that never completes.
func TestUseAfterCloseRefused(t *testing.T) {
	net := transport.NewMemNetwork()
	a, b := openPeer(net, "10.9.2.1"), openPeer(net, "10.9.2.2")
	defer b.close()
	qa, qb := a.createQP(ib.RC), b.createQP(ib.RC)
	connectBoth(a, qa, b, qb)
	require.NoError(t, a.dev.Close())
	require.NoError(t, a.dev.Close(), "closing twice is harmless")
	requirePostError(t, qa.PostSend(ib.SendWR{Opcode: ib.WRSend, Flags: ib.SendInline, Inline: []byte("x")}), 0, ib.ErrDeviceClosed)
	requirePostError(t, qa.PostRecv(ib.RecvWR{SGL: []ib.SGE{a.sge(0, 8)}}), 0, ib.ErrDeviceClosed)
	require.ErrorIs(t, qa.Modify(&ib.QPAttr{State: ib.QPSErr}, ib.AttrState), ib.ErrDeviceClosed)
	_, _, err := qa.Query()
	require.ErrorIs(t, err, ib.ErrDeviceClosed)
	_, err = a.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: a.cq, RecvCQ: a.cq})
	require.ErrorIs(t, err, ib.ErrDeviceClosed)
	_, err = a.dev.AllocPD()
	require.ErrorIs(t, err, ib.ErrDeviceClosed)
	require.Equal(t, 0, a.cq.Len(), "nothing was queued")
}

// Lengths near 2^32 and objects still referenced by windows.
func TestOverflowAndWindowMisuseRefused(t *testing.T) {
	a, qa, b, qb := testPair(t)
	connectBoth(a, qa, b, qb)
	before := snapshot(t, a, b, qa)
	huge := ib.SGE{Addr: a.mr.IOVA(), Length: ^uint32(0), LKey: a.mr.LKey()}
	requirePostError(t, qa.PostSend(ib.SendWR{Opcode: ib.WRSend, SGL: []ib.SGE{huge, huge}}), 0, ib.ErrMsgTooLong)
	requirePostError(t, qa.PostRecv(ib.RecvWR{SGL: []ib.SGE{huge, huge}}), 0, ib.ErrMsgTooLong)
	requireUnchanged(t, before, a, b, qa)

	// A region with a bound window cannot be deregistered, and the PD
	// of a window cannot be deallocated; nothing changes.
	region, err := b.pd.RegMR(b.buf[:8192], ib.AccessLocalWrite|ib.AccessMWBind)
	require.NoError(t, err)
	mw, err := b.pd.AllocMW(ib.MWType1)
	require.NoError(t, err)
	key, err := qb.BindMW(mw, ib.MWBind{ID: 1, Flags: ib.SendSignaled, MR: region, Addr: region.IOVA(), Length: 64, Access: ib.AccessRemoteRead})
	require.NoError(t, err)
	requireWC(t, b, 1, ib.WCSuccess)
	require.ErrorIs(t, region.Dereg(), ib.ErrMWBound)
	require.True(t, region.Valid())
	require.Equal(t, key, mw.RKey())
	require.ErrorIs(t, b.pd.Dealloc(), ib.ErrPDBusy)
	require.NoError(t, qa.PostSend(ib.SendWR{ID: 2, Opcode: ib.WRRDMARead, Flags: ib.SendSignaled,
		SGL: []ib.SGE{a.sge(0, 8)}, RemoteAddr: region.IOVA(), RKey: key}))
	requireWC(t, a, 2, ib.WCSuccess)
	// Unbinding releases the region.
	_, err = qb.BindMW(mw, ib.MWBind{ID: 3, Flags: ib.SendSignaled})
	require.NoError(t, err)
	requireWC(t, b, 3, ib.WCSuccess)
	require.NoError(t, region.Dereg())
	require.NoError(t, mw.Dealloc())
}
